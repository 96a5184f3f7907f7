"""The chat in the middle of the window: the visible thread of one conversation.

A streaming reply is re-rendered at most every ``RENDER_INTERVAL_MS``, however fast the
tokens come, and never more often than leaves the GUI thread ``RENDER_SHARE`` of its time
rendering: each render draws the whole reply, and a long one (200,000 characters) took 200 ms.
The view follows the end of the chat unless the user scrolled up.

A chat opens with its last ``SHOWN_AT_FIRST`` messages; "Show earlier messages" adds the ones
before, a batch at a time. Built all at once, a chat of 2000 messages held the window for 13 s.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from .message_widget import MessageWidget
from .store import Message, ThreadEntry
from .store.records import ASSISTANT

RENDER_INTERVAL_MS = 50
RENDER_SHARE = 0.25
SHOWN_AT_FIRST = 50
COLUMN_WIDTH = 860
_BOTTOM_SLACK = 24


class ChatView(QScrollArea):
    sig_edit_submitted = Signal(int, str)
    sig_regenerate_requested = Signal(int)
    sig_version_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.column = QWidget()
        self.column.setMaximumWidth(COLUMN_WIDTH)
        self.messages_layout = QVBoxLayout(self.column)
        self.messages_layout.setSpacing(10)
        self.messages_layout.addStretch()
        self.empty_hint = QLabel("Type a message below and press Enter.\nShift+Enter starts a new line.")
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_hint.setStyleSheet("color: #8a8a8a;")
        self.messages_layout.insertWidget(0, self.empty_hint)
        self.earlier_button = QPushButton()
        self.earlier_button.setFlat(True)
        self.earlier_button.clicked.connect(self.show_earlier)
        self.earlier_button.hide()
        self.messages_layout.insertWidget(1, self.earlier_button)
        self._earlier: list[ThreadEntry] = []
        page = QWidget()
        row = QHBoxLayout(page)
        row.addStretch()
        row.addWidget(self.column, 100)
        row.addStretch()
        self.setWidget(page)
        self.widgets: dict[int, MessageWidget] = {}
        self._column_minimum = -1
        self._busy = False
        self._pending: dict[int, str] = {}
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_pending)
        self._follow = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda value: setattr(self, "_follow", value >= bar.maximum() - _BOTTOM_SLACK))
        bar.rangeChanged.connect(lambda _low, high: self._follow and bar.setValue(high))

    def minimumSizeHint(self) -> QSize:
        """At least as wide as the messages' column can be: narrower, with no horizontal scroll
        bar, their text was cut off at the right; the window stops narrowing there instead."""
        hint = super().minimumSizeHint()
        column = self.widget().minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()
        return QSize(max(hint.width(), column), hint.height())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # The column's minimum changes with its messages (their buttons): the window must learn it,
        # but only then; a streaming reply asks for a layout at every render.
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            width = self.widget().minimumSizeHint().width()
            if width != self._column_minimum:
                self._column_minimum = width
                self.updateGeometry()
        return super().eventFilter(watched, event)

    def show_thread(self, entries: list[ThreadEntry], busy: bool) -> None:
        self._pending.clear()
        if self.column.isAncestorOf(QApplication.focusWidget()):
            # Hidden, a message holding the keyboard would pass it on to the next control in the
            # window: the sidebar's New chat, where Space starts a new chat.
            self.setFocus()
        for widget in self.widgets.values():
            self.messages_layout.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self.widgets.clear()
        self._busy = busy
        self._earlier = entries[:-SHOWN_AT_FIRST]
        for entry in entries[-SHOWN_AT_FIRST:]:
            self._add(entry)
        self._show_earlier_button()
        self._update_actions()
        self._follow = True

    def show_earlier(self) -> None:
        """Add the batch of messages before the first one shown, keeping in view what was."""
        batch, self._earlier = self._earlier[-SHOWN_AT_FIRST:], self._earlier[:-SHOWN_AT_FIRST]
        bar = self.verticalScrollBar()
        from_bottom = bar.maximum() - bar.value()
        self._follow = False
        shown, self.widgets = self.widgets, {}
        for entry in batch:
            self._add(entry, at=self.messages_layout.indexOf(self.earlier_button) + 1 + len(self.widgets))
        self.widgets.update(shown)
        self._show_earlier_button()
        self._update_actions()
        # Once the layout has made room for them: the messages read before stay where they were.
        QTimer.singleShot(0, lambda: bar.setValue(bar.maximum() - from_bottom))

    def _show_earlier_button(self) -> None:
        self.earlier_button.setText(f"Show earlier messages ({len(self._earlier)} more)")
        self.earlier_button.setVisible(bool(self._earlier))

    def append(self, message: Message) -> None:
        self._add(ThreadEntry(message, 1, 1, [message.id]))
        self._update_actions()
        self._follow = True

    def update_message(self, message: Message) -> None:
        self._pending.pop(message.id, None)
        if message.id in self.widgets:
            self.widgets[message.id].set_message(message)

    def stream(self, message_id: int, text: str) -> None:
        if message_id in self.widgets:
            self._pending[message_id] = text
            if not self._render_timer.isActive():
                self._render_timer.start()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._update_actions()

    def _add(self, entry: ThreadEntry, at: int | None = None) -> None:
        """A message's widget, at layout index ``at`` (default: last, before the stretch)."""
        widget = MessageWidget(entry)
        widget.sig_edit_submitted.connect(self.sig_edit_submitted)
        widget.sig_regenerate_requested.connect(self.sig_regenerate_requested)
        widget.sig_version_requested.connect(self.sig_version_requested)
        self.messages_layout.insertWidget(self.messages_layout.count() - 1 if at is None else at, widget)
        self.widgets[entry.message.id] = widget

    def _update_actions(self) -> None:
        self.empty_hint.setVisible(not self.widgets and not self._earlier)
        widgets = list(self.widgets.values())
        for widget in widgets:
            widget.set_actions_enabled(not self._busy)
            is_last_reply = widget is widgets[-1] and widget.message.role == ASSISTANT
            widget.set_regenerate_visible(is_last_reply and not self._busy)

    def _render_pending(self) -> None:
        pending, self._pending = self._pending, {}
        began = time.perf_counter()
        for message_id, text in pending.items():
            if message_id in self.widgets:
                self.widgets[message_id].set_streaming_text(text)
        spent_ms = 1000 * (time.perf_counter() - began)
        self._render_timer.setInterval(max(RENDER_INTERVAL_MS, round(spent_ms * (1 - RENDER_SHARE) / RENDER_SHARE)))
