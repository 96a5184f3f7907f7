"""One message in the chat: who said it, its text, its versions, its actions and, for
replies, a discreet line of statistics."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .composer import PlainTextInput
from .markdown_view import MarkdownView
from .store import Message, ThreadEntry
from .store.records import FAILED, STREAMING, USER
from .transcripts.reply_stats import stats_line
from .transcripts.transcript import speaker, state_note

EDITOR_LINES = 5


class MessageWidget(QFrame):
    sig_edit_submitted = Signal(int, str)  # message id, new text
    sig_regenerate_requested = Signal(int)
    sig_version_requested = Signal(int)  # id of the sibling to show

    def __init__(self, entry: ThreadEntry, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = entry.message
        self._siblings = entry.sibling_ids
        self._version = entry.version
        is_user = self.message.role == USER
        self.setObjectName("userMessage" if is_user else "assistantMessage")
        if is_user:
            self.setFrameShape(QFrame.Shape.StyledPanel)
            self.setAutoFillBackground(True)
            self.setBackgroundRole(QPalette.ColorRole.AlternateBase)

        self.speaker = QLabel(f"<b>{speaker(self.message)}</b>")
        self.previous_button = _tool_button("‹", "Show the previous version")
        self.version_label = QLabel(f"{entry.version}/{entry.versions}")
        self.next_button = _tool_button("›", "Show the next version")
        self.copy_button = _tool_button("Copy", "Copy this message as Markdown")
        self.edit_button = _tool_button("Edit", "Edit this message and send it again")
        self.regenerate_button = _tool_button("Regenerate", "Write this reply again")
        self.previous_button.clicked.connect(lambda: self._show_version(self._version - 1))
        self.next_button.clicked.connect(lambda: self._show_version(self._version + 1))
        self.copy_button.clicked.connect(self.copy_text)
        self.edit_button.clicked.connect(self.start_editing)
        self.regenerate_button.clicked.connect(lambda: self.sig_regenerate_requested.emit(self.message.id))
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        for widget in (self.speaker, self.previous_button, self.version_label, self.next_button):
            header.addWidget(widget)
        header.addStretch()
        for widget in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(widget)

        self.body = MarkdownView()
        self.editor = PlainTextInput()
        self.editor.setFixedHeight(self.editor.fontMetrics().lineSpacing() * EDITOR_LINES + 12)
        self.save_edit_button = QPushButton("Send")
        self.cancel_edit_button = QPushButton("Cancel")
        for button in (self.save_edit_button, self.cancel_edit_button):
            button.setFocusPolicy(Qt.FocusPolicy.TabFocus)  # a click gives the keyboard to the chat, not to a button about to hide
        self.save_edit_button.clicked.connect(self._submit_edit)
        self.cancel_edit_button.clicked.connect(self.stop_editing)
        edit_buttons = QHBoxLayout()
        edit_buttons.addStretch()
        edit_buttons.addWidget(self.cancel_edit_button)
        edit_buttons.addWidget(self.save_edit_button)
        self.edit_bar = QWidget()
        self.edit_bar.setLayout(edit_buttons)
        self.edit_bar.setVisible(False)

        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.body)
        layout.addWidget(self.editor)
        layout.addWidget(self.edit_bar)
        layout.addWidget(self.note)
        # Only now that every widget has a parent: showing a parentless one opens a window.
        for widget in (self.previous_button, self.version_label, self.next_button):
            widget.setVisible(entry.versions > 1)
        self.edit_button.setVisible(is_user)
        self.regenerate_button.setVisible(False)
        self.editor.setVisible(False)
        self.set_message(self.message)

    def set_message(self, message: Message) -> None:
        """Show the message's current text, state and statistics."""
        self.message = message
        if message.role == USER:
            self.body.set_plain(message.content)
        else:
            self.body.set_markdown(message.content)
        self._show_note()

    def set_streaming_text(self, text: str) -> None:
        self.message.content = text
        self.body.set_markdown(text)

    def set_actions_enabled(self, enabled: bool) -> None:
        """While a reply streams, nothing may change the thread under it."""
        for button in (self.edit_button, self.regenerate_button, self.previous_button, self.next_button,
                       self.save_edit_button):
            button.setEnabled(enabled)
        if enabled:
            self.previous_button.setEnabled(self._version > 1)
            self.next_button.setEnabled(self._version < len(self._siblings))

    def set_regenerate_visible(self, visible: bool) -> None:
        self.regenerate_button.setVisible(visible and self.message.role != USER)

    def copy_text(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)

    def start_editing(self) -> None:
        self.editor.set_text(self.message.content)
        self.body.setVisible(False)
        self.editor.setVisible(True)
        self.edit_bar.setVisible(True)
        self.editor.setFocus()

    def stop_editing(self) -> None:
        focus = QApplication.focusWidget()
        if focus is self.editor or self.edit_bar.isAncestorOf(focus):
            # Hidden, they would pass it on to the next control in the window; it goes back where
            # the edit began, as a closed dialog gives it back.
            self.edit_button.setFocus()
        self.editor.setVisible(False)
        self.edit_bar.setVisible(False)
        self.body.setVisible(True)

    def _submit_edit(self) -> None:
        # The editor stays open until the edit is sent: the view then shows the new thread
        # without this widget. An edit the database refused stays in it, as a message does in
        # the composer.
        text = self.editor.toPlainText()
        if text.strip():
            self.sig_edit_submitted.emit(self.message.id, text)
            if self.editor.isVisible():
                # Refused: the keyboard goes back to the text, which a click on Send gave to the chat.
                self.editor.setFocus()

    def _show_version(self, version: int) -> None:
        if 1 <= version <= len(self._siblings):
            self.sig_version_requested.emit(self._siblings[version - 1])

    def _show_note(self) -> None:
        message = self.message
        if message.state == STREAMING:
            text = "Generating…"
        else:
            text = " · ".join(part for part in (state_note(message), stats_line(message.stats)) if part)
        self.note.setText(text)
        self.note.setVisible(bool(text))
        # Mid-grey reads as secondary on light and dark themes alike; an error is red on both.
        self.note.setStyleSheet(f"color: {'#d84040' if message.state == FAILED else '#8a8a8a'}; font-size: small;")


def _tool_button(text: str, tip: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    return button
