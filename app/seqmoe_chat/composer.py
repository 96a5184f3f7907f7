"""The input box under the chat, with Send and Stop. Enter sends; Shift+Enter starts a
new line. Its kind of box also serves to edit a message."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextOption
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from .text_wrap import fit_wrap_mode, wrap_mode_for

MAX_VISIBLE_LINES = 8


class PlainTextInput(QPlainTextEdit):
    """A box to write in that stays responsive with a long run of text without spaces: its lines
    are then broken anywhere, until it is cleared or given a text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.textChanged.connect(self._break_anywhere_for_edited_block)

    def set_text(self, text: str) -> None:
        fit_wrap_mode(self, text)
        self.setPlainText(text)

    def clear(self) -> None:
        self.set_text("")

    def insertFromMimeData(self, source: QMimeData) -> None:
        self._break_anywhere_for(source.text())
        super().insertFromMimeData(source)

    def _break_anywhere_for(self, text: str) -> None:
        # Before the text comes in: it is laid out before textChanged says it is there, and laid
        # out at word boundaries a paste of 212 KiB of minified JSON took 2.9 s.
        if wrap_mode_for(text) == QTextOption.WrapMode.WrapAnywhere:
            self.setWordWrapMode(QTextOption.WrapMode.WrapAnywhere)

    def _break_anywhere_for_edited_block(self) -> None:
        # Never back to word boundaries here: Undo brings a deleted run back without a paste, laid
        # out before textChanged (1.7 s for 212 KiB at word boundaries). clear() and set_text(),
        # which forget what Undo could bring back, go back. Only the block being edited is
        # searched: the whole text was, at every keystroke.
        if self.wordWrapMode() != QTextOption.WrapMode.WrapAnywhere:
            self._break_anywhere_for(self.textCursor().block().text())


class _InputBox(PlainTextInput):
    sig_enter_pressed = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.sig_enter_pressed.emit()
            return
        if enter:
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    sig_message_submitted = Signal(str)
    sig_stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.input = _InputBox()
        self.input.setPlaceholderText("Message the model (Enter sends, Shift+Enter starts a new line)")
        self.input.setTabChangesFocus(True)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        # Each is disabled once it has done its work, and Qt passes the focus of a disabled button
        # on to the next control (the model list, where typing "o" opened a folder dialog): a click
        # leaves the focus in the box.
        for button in (self.send_button, self.stop_button):
            button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.input.sig_enter_pressed.connect(self.submit)
        self.send_button.clicked.connect(self.submit)
        self.stop_button.clicked.connect(self.sig_stop_requested)
        self.input.textChanged.connect(self._fit_height)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 10)
        layout.addWidget(self.input, 1)
        layout.addLayout(buttons)
        self.set_busy(False)
        self._fit_height()

    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.set_text(text)

    def clear(self) -> None:
        self.input.clear()

    def submit(self) -> None:
        """Offer the text; the window clears the box once the message is accepted."""
        if self.send_button.isEnabled() and self.text().strip():
            self.sig_message_submitted.emit(self.text())

    def set_busy(self, busy: bool) -> None:
        for button, enabled in ((self.send_button, not busy), (self.stop_button, busy)):
            if button.hasFocus() and not enabled:
                self.input.setFocus()  # reached with Tab: its focus goes back to the box, not on
            button.setEnabled(enabled)

    def _fit_height(self) -> None:
        line = self.input.fontMetrics().lineSpacing()
        # A plain-text document's height is its number of visual lines, wrapped ones included.
        lines = min(max(int(self.input.document().size().height()), 2), MAX_VISIBLE_LINES)
        margins = self.input.contentsMargins()
        frame = 2 * self.input.frameWidth() + 2 * int(self.input.document().documentMargin())
        self.input.setFixedHeight(lines * line + frame + margins.top() + margins.bottom())
