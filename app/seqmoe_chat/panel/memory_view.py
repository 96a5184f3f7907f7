"""Memory: VRAM split by use (the engine's resident weights, expert cache and KV-cache
reserve, the rest of this process, other processes, free) with the budget line, and the
system RAM. Without NVML the VRAM bar shows the engine's own figures and says why."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from seqmoe.gib import GIB

from ..worker import ModelInfo
from .memory_monitor import MemorySample

BUDGET_COLOUR = "#d32f2f"
COLOURS = {
    "resident weights": "#7e57c2",
    "expert cache": "#3f8fd2",
    "KV cache": "#26a69a",
    "workspace": "#90a4ae",
    "rest of this process": "#ffb74d",
    "other processes": "#e57373",
    "this process": "#3f8fd2",
}


@dataclass(frozen=True)
class Segment:
    name: str
    size: int


class StackedBar(QWidget):
    """One horizontal bar: ``segments`` from the left, on a scale of ``total`` bytes, with an
    optional marker line (the budget)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: list[Segment] = []
        self.total = 1
        self.marker: int | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(300, 18)

    def set_segments(self, segments: list[Segment], total: int, marker: int | None = None) -> None:
        self.segments, self.total, self.marker = segments, max(total, 1), marker
        self.setToolTip("\n".join(f"{s.name}: {s.size / GIB:.3f} GiB" for s in segments)
                        + ("" if marker is None else f"\nbudget: {marker / GIB:.3f} GiB"))
        self.setVisible(True)
        self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        area = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        scale = area.width() / self.total
        # The free part is the base colour and the outline the placeholder text's: both stand out
        # from the window in the light and the dark palette alike (the dark one's mid colour does not).
        painter.fillRect(area, self.palette().base())
        x = area.left()
        for segment in self.segments:
            width = segment.size * scale
            painter.fillRect(QRectF(x, area.top(), width, area.height()), QColor(COLOURS[segment.name]))
            x += width
        painter.setPen(self.palette().placeholderText().color())
        painter.drawRect(area)
        if self.marker is not None:
            marker_x = area.left() + min(self.marker, self.total) * scale
            painter.setPen(QPen(QColor(BUDGET_COLOUR), 2, Qt.PenStyle.DashLine))
            painter.drawLine(round(marker_x), self.rect().top(), round(marker_x), self.rect().bottom())


def engine_segments(info: ModelInfo) -> list[Segment]:
    """What the engine's budget arithmetic sets aside on its device."""
    geometry = info.geometry
    assert geometry is not None
    return [
        Segment("resident weights", geometry.resident_bytes),
        Segment("expert cache", info.cache_slots * geometry.bytes_per_expert),
        Segment("KV cache", geometry.kv_bytes),
        Segment("workspace", geometry.workspace_bytes),
    ]


def _legend(names: list[str]) -> str:
    return " &nbsp; ".join(f"<span style='color:{COLOURS[name]}'>■</span> {name}" for name in names)


class MemoryView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.vram_caption = QLabel()
        self.vram = StackedBar()
        self.vram_legend = QLabel()
        self.vram_legend.setWordWrap(True)
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.ram_caption = QLabel()
        self.ram = StackedBar()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.vram_caption, self.vram, self.vram_legend, self.problem, self.ram_caption, self.ram):
            layout.addWidget(widget)

    def show_memory(self, info: ModelInfo | None, sample: MemorySample | None) -> None:
        gpu = sample.gpu if sample is not None else None
        self.problem.setText(sample.gpu_problem if sample is not None else "")
        self.problem.setVisible(bool(self.problem.text()))
        self._show_vram(info, sample)
        if sample is None or sample.ram is None:
            self.ram_caption.setText(sample.ram_problem if sample is not None else "")
            self.ram.setVisible(False)
        else:
            ram = sample.ram
            self.ram_caption.setText(f"RAM: {ram.used / GIB:.1f} of {ram.total / GIB:.1f} GiB used, "
                                     f"{ram.this_process / GIB:.2f} GiB by this app")
            self.ram.set_segments([Segment("this process", ram.this_process),
                           Segment("other processes", max(ram.used - ram.this_process, 0))], ram.total)
        if gpu is not None and not (info is not None and info.device.startswith("cuda")):
            self.problem.setText(f"{gpu.name}: {gpu.used / GIB:.2f} of {gpu.total / GIB:.2f} GiB used "
                                 "(the model runs on the CPU)")
            self.problem.setVisible(True)

    def _show_vram(self, info: ModelInfo | None, sample: MemorySample | None) -> None:
        gpu = sample.gpu if sample is not None else None
        if info is None or info.geometry is None:
            self.vram_caption.setText("VRAM: no model loaded")
            self.vram.setVisible(False)
            self.vram_legend.setText("")
            return
        segments = engine_segments(info)
        engine_bytes = sum(s.size for s in segments)
        budget = info.geometry.budget_bytes_for(info.cache_slots)
        if gpu is not None and info.device.startswith("cuda"):
            segments += [Segment("rest of this process", max(gpu.this_process - engine_bytes, 0)),
                         Segment("other processes", max(gpu.used - gpu.this_process, 0))]
            self.vram_caption.setText(f"VRAM ({gpu.name}): {gpu.used / GIB:.2f} of {gpu.total / GIB:.2f} GiB used, "
                                      f"{gpu.this_process / GIB:.2f} GiB by this app; budget {budget / GIB:.3f} GiB")
            self.vram.set_segments(segments, gpu.total, budget)
        else:
            where = (f"The engine's VRAM on {info.device} (no NVML figures)" if info.device.startswith("cuda")
                     else f"Emulated VRAM on the {info.device}")
            self.vram_caption.setText(f"{where}: the engine's budget {budget / GIB:.3f} GiB")
            self.vram.set_segments(segments, max(budget, engine_bytes), budget)
        self.vram_legend.setText(_legend([s.name for s in segments]))
