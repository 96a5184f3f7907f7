"""Rows of a name and a value, painted directly: a new value repaints this widget alone,
where a QLabel's new text would make the whole panel lay itself out again."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

GAP = 12


class TextRows(QWidget):
    def __init__(self, names: Sequence[str], tooltips: dict[str, str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.names = list(names)
        self.values = dict.fromkeys(self.names, "–")
        self.setToolTip("\n".join(f"{name}: {text}" for name, text in (tooltips or {}).items()))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def line_height(self) -> int:
        return self.fontMetrics().height() + 3

    def sizeHint(self) -> QSize:
        return QSize(300, len(self.names) * self.line_height())

    def set_values(self, values: dict[str, str]) -> None:
        if any(self.values[name] != text for name, text in values.items()):
            self.values.update(values)
            self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().windowText().color())
        metrics, line = self.fontMetrics(), self.line_height()
        value_x = max(metrics.horizontalAdvance(name) for name in self.names) + GAP
        for row, name in enumerate(self.names):
            top = row * line
            painter.drawText(QRect(0, top, value_x, line), Qt.AlignmentFlag.AlignVCenter, name)
            painter.drawText(QRect(value_x, top, self.width() - value_x, line), Qt.AlignmentFlag.AlignVCenter,
                             self.values[name])
