"""The live SeqMoE panel as a dock, sampled off the generation path and only while visible.

The engine pushes its events into an ``EventBuffer`` (bounded; the engine never waits for
the panel). A timer drains it at most 10 times a second, folds the batch into the
``TelemetryModel`` and updates the views once. While the dock is hidden the timer stops
and the buffer is unsubscribed, so the engine does not even build its events.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QDockWidget, QFileDialog, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from ..engine_client import EngineClient
from ..store.settings import PANEL_HZ
from ..worker import ModelInfo
from .cache_map import CacheMap
from .counters import CountersView
from .figures_export import export_figures
from .forecast_view import ForecastView
from .memory_monitor import MemoryMonitor, MemorySample
from .memory_view import MemoryView
from .stall_view import StallView
from .telemetry_model import TelemetryModel

if TYPE_CHECKING:
    from seqmoe.events import EventBuffer

CHART_INTERVAL_S = 0.5
"""The pyqtgraph charts (recall, stall timeline) and the stall list are the dearest views to
repaint; they follow at most twice a second, the rest at every refresh."""


@dataclass
class RefreshCost:
    """CPU time the GUI thread spent in refreshes (draining, folding, updating the views)."""

    cpu_seconds: float = 0.0
    refreshes: int = 0
    events: int = 0

    def share_of_core(self, wall_seconds: float) -> float:
        return self.cpu_seconds / wall_seconds if wall_seconds > 0 else 0.0


class TelemetryDock(QDockWidget):
    def __init__(self, client: EngineClient, hz: int, parent: QWidget | None = None) -> None:
        super().__init__("SeqMoE live", parent)
        self.setObjectName("seqmoeLivePanel")  # saveState() remembers the dock by this name
        self.client = client
        self.info: ModelInfo | None = None
        self.model: TelemetryModel | None = None
        self.buffer: EventBuffer | None = None
        self._watching = False
        self.monitor = MemoryMonitor()
        self.cost = RefreshCost()
        self._shown_serial = -1
        self._shown_memory: MemorySample | None = None
        self._charts_stale = False
        self._charts_due = 0.0

        self.memory = MemoryView()
        self.counters = CountersView()
        self.cache_map = CacheMap()
        self.forecast = ForecastView()
        self.stalls = StallView()
        self.export_button = QPushButton("Export figures…")
        self.export_button.setToolTip("Save this reply's figures as JSON and the charts as PNG")
        self.export_button.clicked.connect(self.ask_export)
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        content = QWidget()
        layout = QVBoxLayout(content)
        for title, view in (("Memory", self.memory), ("This reply", self.counters), ("Expert cache", self.cache_map),
                            ("Predicted vs routed", self.forecast), ("Stalls", self.stalls)):
            layout.addWidget(_heading(title))
            layout.addWidget(view)
        layout.addWidget(self.export_button)
        layout.addWidget(self.notice)
        layout.addStretch()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(content)
        self.setWidget(scroll)
        self.setMinimumWidth(300)

        self.timer = QTimer(self)
        self.timer.timeout.connect(self.refresh)
        self.set_rate(hz)
        self.visibilityChanged.connect(self._on_visibility_changed)
        worker = client.worker
        worker.sig_model_loaded.connect(self._on_model_changed)
        worker.sig_model_reconfigured.connect(self._on_model_changed)
        worker.sig_reconfigure_failed.connect(self._on_reconfigure_failed)
        worker.sig_model_unloaded.connect(self._on_model_unloaded)
        # As the window and the client see it: a load given up leaves no model, one that failed the
        # model it kept, if any.
        worker.sig_load_failed.connect(self._on_load_failed)
        worker.sig_load_cancelled.connect(self._on_model_unloaded)

    def set_rate(self, hz: int) -> None:
        self.timer.setInterval(1000 // min(max(hz, PANEL_HZ[0]), PANEL_HZ[1]))

    @property
    def sampling(self) -> bool:
        return self.timer.isActive()

    def resume(self) -> None:
        if self.timer.isActive():
            return
        self._watch(True)
        self.monitor.start()
        self.timer.start()

    def pause(self) -> None:
        self.timer.stop()
        self._watch(False)
        self.monitor.stop()

    def set_model(self, info: ModelInfo | None) -> None:
        if info is None or info.geometry is None:
            self.info = self.model = None
        else:
            if self.buffer is None:
                # Imported now, not with the window: the engine (and PyTorch) is loaded by now.
                from seqmoe.events import EventBuffer

                self.buffer = EventBuffer()
                if self.timer.isActive():
                    self._watch(True)
            model = self.model
            all_resident = info.policy == "full"
            # The same model resized or given another policy keeps its reply's figures; another model does not.
            if model is None or self.info is None or self.info.path != info.path or (
                model.num_layers, model.num_experts, model.bytes_per_copy, model.all_resident
            ) != (info.num_layers, info.experts_per_layer, info.bytes_per_copy, all_resident):
                # The last model's events still waiting index its own layers and experts: folded
                # into the new model they raised IndexError (a model loaded after a reply).
                self.buffer.drain()
                self.model = TelemetryModel(info.num_layers, info.experts_per_layer, info.bytes_per_copy,
                                            all_resident=all_resident, cached=info.cached)
            else:  # between generations: the cache as the resize or the new policy left it
                # The last reply's closing snapshot may still wait in the buffer: folded later, it
                # would paint the pool as it was before.
                model.fold(self._drain())
                model.show_cached(info.cached)
            self.info = info
            self.monitor.use_device(_cuda_index(info.device))
        self._show(force=True)

    @Slot()
    def refresh(self) -> None:
        started = time.thread_time()
        events = self._drain()
        if self.model is not None:
            self.model.fold(events)
        self._show()
        self.cost.cpu_seconds += time.thread_time() - started
        self.cost.refreshes += 1
        self.cost.events += len(events)

    def _drain(self) -> list[Any]:
        return self.buffer.drain() if self.buffer is not None and self._watching else []

    def figures(self) -> dict[str, Any]:
        """What the panel knows now, as plain JSON values."""
        memory = self.monitor.latest
        return {
            "model": asdict(self.info) if self.info is not None else None,
            "figures": self.model.summary() if self.model is not None else None,
            "memory": asdict(memory) if memory is not None else None,
            "events_dropped": self.buffer.dropped if self.buffer is not None else 0,
        }

    def charts(self) -> dict[str, QWidget]:
        return {"memory": self.memory, "counters": self.counters, "cache-map": self.cache_map,
                "forecast": self.forecast, "stalls": self.stalls, "panel": self.widget()}

    def export_to(self, folder: Path) -> list[Path]:
        self.refresh()
        return export_figures(folder, self.figures(), self.charts())

    def ask_export(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export the panel's figures to")
        if not folder:
            return
        try:
            written = self.export_to(Path(folder))
        except OSError as error:
            self.notice.setText(f"The figures could not be saved: {error}")
            return
        self.notice.setText(f"Saved {len(written)} files to {folder}")

    def _show(self, force: bool = False) -> None:
        """Update the views from the model and the latest memory sample, each only when it changed."""
        model, memory = self.model, self.monitor.latest
        serial = model.serial if model is not None else -1
        model_changed = force or serial != self._shown_serial
        memory_changed = force or memory is not self._shown_memory
        self._shown_serial, self._shown_memory = serial, memory
        if model_changed:
            self.cache_map.show_model(model)
            self.forecast.show_model(model)
            self._charts_stale = True
        if self._charts_stale and (force or time.monotonic() >= self._charts_due):
            self.forecast.show_recall(model)
            self.stalls.show_model(model)
            self._charts_stale = False
            self._charts_due = time.monotonic() + CHART_INTERVAL_S
        if model_changed or memory_changed:
            self.counters.show_model(model, memory)
        if memory_changed:
            self.memory.show_memory(self.info, memory)

    def _watch(self, on: bool) -> None:
        if self.buffer is None or on == self._watching:
            return
        if on:
            self.client.worker.watch_events(self.buffer)
        else:
            self.client.worker.unwatch_events(self.buffer)
            self.buffer.drain()  # what came while hiding would describe a moment long gone
        self._watching = on

    @Slot(bool)
    def _on_visibility_changed(self, visible: bool) -> None:
        if visible:
            self.resume()
        else:
            self.pause()

    @Slot(int, object)
    def _on_model_changed(self, _request_id: int, info: ModelInfo) -> None:
        self.set_model(info)

    @Slot(int, str, object)
    def _on_reconfigure_failed(self, _request_id: int, _reason: str, info: ModelInfo) -> None:
        self.set_model(info)

    @Slot(int, str, object)
    def _on_load_failed(self, _request_id: int, _reason: str, kept: ModelInfo | None) -> None:
        self.set_model(kept)

    @Slot()
    def _on_model_unloaded(self) -> None:
        self.set_model(None)


def _heading(text: str) -> QLabel:
    label = QLabel(text)
    font = QFont(label.font())
    font.setBold(True)
    label.setFont(font)
    label.setAlignment(Qt.AlignmentFlag.AlignLeft)
    return label


def _cuda_index(device: str) -> int:
    """NVML numbers devices as CUDA does when CUDA_VISIBLE_DEVICES does not reorder them."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else 0
