"""Predicted against routed experts: for the current token, each layer's forecast
probabilities (a heat map, layers by experts) with rings on the experts its router chose,
and the running recall@k per forecast horizon (a pyqtgraph bar chart)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from .layer_grid import BLANK_COLOUR, LayerGrid
from .plots import quiet_plot
from .telemetry_model import TelemetryModel

ROUTED_COLOUR = "#ff4d4d"
NO_FORECAST_COLOUR = BLANK_COLOUR
"""A layer that routed without a forecast (the first layers of a reply, policies that do not
forecast): not viridis' 0, which would read as a forecast of "none of them"."""
_NO_FORECAST_ARGB = np.uint32(QColor(NO_FORECAST_COLOUR).rgba())
RECALL_COLOUR = "#3f8fd2"


def _argb_lut(name: str) -> np.ndarray:
    rgba = pg.colormap.get(name).getLookupTable(0.0, 1.0, 256, alpha=True).astype(np.uint32)
    return (rgba[:, 3] << 24) | (rgba[:, 0] << 16) | (rgba[:, 1] << 8) | rgba[:, 2]


class ForecastGrid(LayerGrid):
    """Forecast probability per cell (viridis, 0 to 1; grey where there was none); a ring marks
    each routed expert."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lut = _argb_lut("viridis")
        self.routed: list[tuple[int, ...]] = []
        self.probabilities = np.zeros((0, 0), dtype=np.float32)
        self.describe = self._describe

    def show_forecast(self, probabilities: np.ndarray, routed: list[tuple[int, ...]]) -> None:
        self.probabilities, self.routed = probabilities.copy(), list(routed)
        known = ~np.isnan(probabilities)
        levels = np.clip(np.nan_to_num(probabilities) * 255, 0, 255).astype(np.uint8)
        self.set_colours(np.where(known, self._lut[levels], _NO_FORECAST_ARGB))

    def paint_overlay(self, painter: QPainter) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(QColor(ROUTED_COLOUR), 2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        for layer, experts in enumerate(self.routed):
            for expert in experts:
                cell = self.cell_rect(layer, expert)
                radius = max(min(cell.width(), cell.height()) / 2 - 2, 2)
                painter.drawEllipse(cell.center(), radius, radius)

    def _describe(self, layer: int, expert: int) -> str:
        routed = expert in self.routed[layer] if layer < len(self.routed) else False
        probability = self.probabilities[layer, expert]
        forecast = "no forecast" if np.isnan(probability) else f"forecast {probability:.2f}"
        return f"layer {layer}, expert {expert}: {forecast}, {'routed' if routed else 'not routed'} at the current token"


class ForecastView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.grid = ForecastGrid()
        self.recall_plot = quiet_plot(110)
        self.recall_plot.setLabel("left", "recall@k")
        self.recall_plot.setLabel("bottom", "horizon (layers ahead)")
        self.recall_plot.setYRange(0, 1, padding=0.05)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=RECALL_COLOUR)
        self.recall_plot.addItem(self.bars)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.grid)
        layout.addWidget(self.recall_plot)
        layout.addWidget(self.caption)
        self._shown_recall: tuple = ()
        self.show_model(None)
        self.show_recall(None)

    def show_model(self, model: TelemetryModel | None) -> None:
        """The heat map: cheap, so it follows every refresh."""
        if model is None:
            self.grid.clear()
        else:
            self.grid.show_forecast(model.predicted, model.routed)

    def show_recall(self, model: TelemetryModel | None) -> None:
        """The recall chart, redrawn only when a bar moves by a percent: a plot's repaint is dear."""
        horizons = sorted(model.recall) if model is not None else []
        recalls = [model.recall[h].recall or 0.0 for h in horizons] if model is not None else []
        shown = tuple(zip(horizons, (round(r, 2) for r in recalls)))
        if shown == self._shown_recall and shown:
            return
        if len(shown) != len(self._shown_recall) and horizons:
            self.recall_plot.setXRange(0.4, max(horizons) + 0.6, padding=0)
            self.recall_plot.getAxis("bottom").setTicks([[(h, str(h)) for h in horizons]])
        self._shown_recall = shown
        self.bars.setOpts(x=horizons, height=recalls, width=0.6)
        if horizons:
            self.caption.setText("Colour: each layer's forecast for this token (0 to 1; grey: none); red rings: "
                                 "the experts routed. recall@k " + " · ".join(f"h={h} {r:.0%}" for h, r in shown))
        else:
            self.caption.setText("No forecasts yet: the seqmoe and gate policies forecast while a reply is decoded.")
