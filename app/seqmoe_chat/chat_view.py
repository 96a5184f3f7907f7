"""The chat in the middle of the window: the visible thread of one conversation.

A streaming reply is re-rendered at most every ``RENDER_INTERVAL_MS``, however fast the
tokens come; the view follows the end of the chat unless the user scrolled up.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from .message_widget import MessageWidget
from .store import Message, ThreadEntry
from .store.records import ASSISTANT

RENDER_INTERVAL_MS = 50
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
        page = QWidget()
        row = QHBoxLayout(page)
        row.addStretch()
        row.addWidget(self.column, 100)
        row.addStretch()
        self.setWidget(page)
        self.widgets: dict[int, MessageWidget] = {}
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
        # The column's minimum changes with its messages (their buttons): the window must learn it.
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()
        return super().eventFilter(watched, event)

    def show_thread(self, entries: list[ThreadEntry], busy: bool) -> None:
        self._pending.clear()
        for widget in self.widgets.values():
            self.messages_layout.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self.widgets.clear()
        self._busy = busy
        for entry in entries:
            self._add(entry)
        self._update_actions()
        self._follow = True

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

    def _add(self, entry: ThreadEntry) -> None:
        widget = MessageWidget(entry)
        widget.sig_edit_submitted.connect(self.sig_edit_submitted)
        widget.sig_regenerate_requested.connect(self.sig_regenerate_requested)
        widget.sig_version_requested.connect(self.sig_version_requested)
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, widget)
        self.widgets[entry.message.id] = widget

    def _update_actions(self) -> None:
        self.empty_hint.setVisible(not self.widgets)
        widgets = list(self.widgets.values())
        for widget in widgets:
            widget.set_actions_enabled(not self._busy)
            is_last_reply = widget is widgets[-1] and widget.message.role == ASSISTANT
            widget.set_regenerate_visible(is_last_reply and not self._busy)

    def _render_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for message_id, text in pending.items():
            if message_id in self.widgets:
                self.widgets[message_id].set_streaming_text(text)
