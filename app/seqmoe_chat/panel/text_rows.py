"""Rows of a name and a value, painted directly: a new value repaints this widget alone,
where a QLabel's new text would make the whole panel lay itself out again."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QRect, QSize, Qt
from PySide6.QtGui import QHelpEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

GAP = 12


class TextRows(QWidget):
    def __init__(self, names: Sequence[str], tooltips: dict[str, str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.names = list(names)
        self.values = dict.fromkeys(self.names, "–")
        self.tooltips = dict(tooltips or {})
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def line_height(self) -> int:
        return self.fontMetrics().height() + 3

    def sizeHint(self) -> QSize:
        return QSize(300, len(self.names) * self.line_height())

    def set_values(self, values: dict[str, str]) -> None:
        if any(self.values[name] != text for name, text in values.items()):
            self.values.update(values)
            self.update()

    def shown_value(self, name: str) -> str:
        """The value as painted: cut with an ellipsis where the panel is narrower than it (its
        row's tooltip holds all of it), so a cut value does not pass for a whole one."""
        return self.fontMetrics().elidedText(self.values[name], Qt.TextElideMode.ElideRight,
                                             self.width() - self._value_x())

    def row_tooltip(self, row: int) -> str:
        name = self.names[row]
        return "\n".join(filter(None, (f"{name}: {self.values[name]}", self.tooltips.get(name))))

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            row = event.pos().y() // self.line_height()
            if 0 <= row < len(self.names):
                QToolTip.showText(event.globalPos(), self.row_tooltip(row), self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)

    def _value_x(self) -> int:
        return max(self.fontMetrics().horizontalAdvance(name) for name in self.names) + GAP

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().windowText().color())
        line, value_x = self.line_height(), self._value_x()
        for row, name in enumerate(self.names):
            top = row * line
            painter.drawText(QRect(0, top, value_x, line), Qt.AlignmentFlag.AlignVCenter, name)
            painter.drawText(QRect(value_x, top, self.width() - value_x, line), Qt.AlignmentFlag.AlignVCenter,
                             self.shown_value(name))
