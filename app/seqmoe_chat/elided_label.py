"""A one-line label that gives up room gracefully."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel

from .tooltips import plain_tooltip


class ElidedLabel(QLabel):
    """One line of text that asks for room to show all of it but makes do with less, elided
    (whole in its tooltip): a long loading stage never widens the toolbar, and with it the
    window, past the screen; a long chat title never squeezes the conversation list."""

    def __init__(self) -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.PlainText)  # the user's text (a title, a prompt), never markup
        self._full = ""

    def set_full_text(self, text: str) -> None:
        self._full = text
        self.setToolTip(plain_tooltip(text))
        self._elide()
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, self.width()))
