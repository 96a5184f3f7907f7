"""Stalls: compute time spent waiting for experts, per token, and the latest stall events."""

from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from .plots import quiet_plot
from .telemetry_model import TelemetryModel

STALL_COLOUR = "#e05d5d"
LISTED = 12


class StallView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.timeline = quiet_plot(110)
        self.timeline.setLabel("left", "stall", units="s")
        self.timeline.setLabel("bottom", "token")
        self.curve = self.timeline.plot([0, 1], [0], stepMode="center", fillLevel=0, brush=STALL_COLOUR,
                                        pen=STALL_COLOUR)
        self.timeline.enableAutoRange(x=False)
        self.latest = QTreeWidget()
        self.latest.setHeaderLabels(["token", "layer", "expert", "ms", "cause"])
        self.latest.setRootIsDecorated(False)
        self.latest.setUniformRowHeights(True)
        self.latest.setMaximumHeight(150)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.timeline)
        layout.addWidget(self.latest)
        self._shown: tuple[int, int, int] | None = None

    def show_model(self, model: TelemetryModel | None) -> None:
        generation = model.generations if model is not None else -1
        tokens = len(model.stall_per_token) if model is not None else 0
        stalls = model.counters.stalls if model is not None else 0
        # Only a new token or stall changes this view.
        previous, self._shown = self._shown, (generation, tokens, stalls)
        if self._shown == previous:
            return
        per_token = np.asarray(model.stall_per_token if tokens else [0.0])
        self.curve.setData(np.arange(per_token.size + 1), per_token)
        # The axis is redrawn only when the range grows, in steps of 32 tokens.
        self.timeline.setXRange(0, max(32, -(-per_token.size // 32) * 32), padding=0)
        if previous is not None and (previous[0], previous[2]) == (generation, stalls):
            return
        self.latest.clear()
        for stall in list(model.recent_stalls)[:LISTED] if model is not None else ():
            cause = f"{stall.cause} (prefill)" if stall.prefill else stall.cause
            self.latest.addTopLevelItem(QTreeWidgetItem(
                [str(stall.token), str(stall.layer), str(stall.expert), f"{stall.seconds * 1000:.2f}", cause]
            ))
