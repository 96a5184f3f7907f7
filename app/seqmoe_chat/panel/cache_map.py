"""The cache map: one cell per (layer, expert), coloured by what the expert cache holds,
with a legend that counts the cells of each colour. Hovering a cell shows its layer,
expert, last use and latest predicted probability."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QWidget

from .layer_grid import BLANK_COLOUR, LayerGrid
from .telemetry_model import CELL_STATES, IN_USE, LOADING, NOT_CACHED, READY, TelemetryModel

STATE_COLOURS = {NOT_CACHED: BLANK_COLOUR, LOADING: "#f2a93b", READY: "#3f8fd2", IN_USE: "#2fae5a"}
_LUT = np.array([QColor(STATE_COLOURS[state]).rgba() for state in range(len(CELL_STATES))], dtype=np.uint32)
SWATCH = 10


class CacheMap(LayerGrid):
    footer_lines = 1

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.counts = dict.fromkeys(CELL_STATES, 0)

    def show_model(self, model: TelemetryModel | None) -> None:
        if model is None:
            self.describe = None
            self.counts = dict.fromkeys(CELL_STATES, 0)
            self.clear()
            return
        self.describe = model.describe_cell
        self.counts = model.cell_counts()
        self.set_colours(_LUT[model.cells])

    def paint_footer(self, painter: QPainter, area: QRect) -> None:
        x = area.left() + 2
        metrics = self.fontMetrics()
        painter.setPen(self.palette().windowText().color())
        for state, name in enumerate(CELL_STATES):
            top = area.top() + (area.height() - SWATCH) // 2
            painter.fillRect(x, top, SWATCH, SWATCH, QColor(STATE_COLOURS[state]))
            text = f"{name} {self.counts[name]}"
            painter.drawText(QRect(x + SWATCH + 4, area.top(), metrics.horizontalAdvance(text) + 2, area.height()),
                             Qt.AlignmentFlag.AlignVCenter, text)
            x += SWATCH + 4 + metrics.horizontalAdvance(text) + 14
