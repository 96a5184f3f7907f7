"""A layers-by-experts grid of coloured cells, the common ground of the cache map and the
forecast heat map.

The cells are one pixel each of an image scaled to the widget, and the grid lines and
layer numbers a pixmap drawn once per size, so a repaint costs the same for 128 experts as
for 16 000. Hovering a cell asks ``describe`` for its tooltip (on mouse moves: overriding
``event`` would run Python for every event the widget gets). Subclasses paint over the cells
and in a footer of ``footer_lines`` lines; everything is painted here, because a label's
new text would make the whole panel lay itself out again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QImage, QMouseEvent, QPainter, QPaintEvent, QPixmap
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

LABEL_WIDTH = 22
GRID_LINES_FROM = 6  # cell size in pixels from which the cells get a visible border
BLANK_COLOUR = "#c9cdd3"
"""A cell with nothing to show: an expert not cached, a layer without a forecast."""


class LayerGrid(QWidget):
    footer_lines = 0

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.layers = self.experts = 0
        self.describe: Callable[[int, int], str] | None = None
        self._image = QImage()
        self._lines = QPixmap()  # grid lines and layer numbers for the current size and shape
        self._lines_key: tuple[int, int, int, int] | None = None
        self._hover: tuple[int, int] | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)

    def sizeHint(self) -> QSize:
        return QSize(320, 150 + self.footer_height())

    def footer_height(self) -> int:
        return self.footer_lines * (self.fontMetrics().height() + 2)

    def set_colours(self, argb: np.ndarray) -> None:
        """``argb``: one 0xAARRGGBB value per (layer, expert)."""
        self.layers, self.experts = argb.shape
        # Copied into an image that owns its memory: one wrapping a NumPy buffer needs that buffer alive.
        image = QImage(self.experts, self.layers, QImage.Format.Format_ARGB32)
        if argb.size:
            rows = np.frombuffer(image.bits(), dtype=np.uint32).reshape(self.layers, image.bytesPerLine() // 4)
            rows[:, : self.experts] = argb
        self._image = image
        if self._hover is not None and not (self._hover[0] < self.layers and self._hover[1] < self.experts):
            # A model of fewer layers or experts came in under the mouse: that cell is gone.
            self._hover = None
            self.setToolTip("")
        if self._hover is not None and self.describe is not None:
            self.setToolTip(self.describe(*self._hover))
        self.update()

    def clear(self) -> None:
        self.set_colours(np.zeros((0, 0), dtype=np.uint32))

    def grid_rect(self) -> QRect:
        return self.rect().adjusted(LABEL_WIDTH, 0, 0, -self.footer_height())

    def cell_rect(self, layer: int, expert: int) -> QRectF:
        grid = self.grid_rect()
        width, height = grid.width() / self.experts, grid.height() / self.layers
        return QRectF(grid.left() + expert * width, grid.top() + layer * height, width, height)

    def cell_at(self, position: QPoint) -> tuple[int, int] | None:
        """The (layer, expert) under ``position``, if any."""
        grid = self.grid_rect()
        if not self.layers or not grid.contains(position):
            return None
        expert = (position.x() - grid.left()) * self.experts // grid.width()
        layer = (position.y() - grid.top()) * self.layers // grid.height()
        return min(layer, self.layers - 1), min(expert, self.experts - 1)

    def paint_overlay(self, painter: QPainter) -> None:
        """Drawn over the cells; nothing by default."""

    def paint_footer(self, painter: QPainter, area: QRect) -> None:
        """Drawn below the cells in ``footer_lines`` lines; nothing by default."""

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        if self.footer_lines:
            self.paint_footer(painter, self.rect().adjusted(0, self.rect().height() - self.footer_height(), 0, 0))
        if not self.layers:
            return
        painter.drawImage(self.grid_rect(), self._image)
        painter.drawPixmap(0, 0, self._grid_lines())
        self.paint_overlay(painter)

    def _grid_lines(self) -> QPixmap:
        key = (self.width(), self.height(), self.layers, self.experts)
        if key == self._lines_key:
            return self._lines
        self._lines_key = key
        self._lines = QPixmap(self.size())
        self._lines.fill(Qt.GlobalColor.transparent)
        painter = QPainter(self._lines)
        grid = self.grid_rect()
        cell_w, cell_h = grid.width() / self.experts, grid.height() / self.layers
        if min(cell_w, cell_h) >= GRID_LINES_FROM:
            painter.setPen(self.palette().window().color())
            for expert in range(1, self.experts):
                x = grid.left() + round(expert * cell_w)
                painter.drawLine(x, grid.top(), x, grid.bottom())
            for layer in range(1, self.layers):
                y = grid.top() + round(layer * cell_h)
                painter.drawLine(grid.left(), y, grid.right(), y)
        # Layer numbers on the left, as many as fit legibly.
        painter.setPen(self.palette().windowText().color())
        line = self.fontMetrics().height()
        step = max(1, int(np.ceil(line / max(cell_h, 1e-9))))
        for layer in range(0, self.layers, step):
            top = grid.top() + round(layer * cell_h)
            painter.drawText(QRect(0, top, LABEL_WIDTH - 4, max(round(cell_h), line)),
                             Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, str(layer))
        painter.end()
        return self._lines

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        cell = self.cell_at(event.position().toPoint())
        if cell != self._hover:
            self._hover = cell
            text = self.describe(*cell) if cell is not None and self.describe is not None else ""
            self.setToolTip(text)
            if QToolTip.isVisible():
                QToolTip.showText(event.globalPosition().toPoint(), text, self)
        super().mouseMoveEvent(event)

    def leaveEvent(self, event) -> None:
        self._hover = None
        super().leaveEvent(event)
