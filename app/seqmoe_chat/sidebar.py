"""The conversation list on the left: search, new, rename, export, delete with undo."""

from __future__ import annotations

import time

from PySide6.QtCore import QModelIndex, QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QPainter, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from .store import ConversationSummary
from .tooltips import plain_tooltip
from .transcripts.export import FORMAT_NAMES

ID_ROLE = Qt.ItemDataRole.UserRole
SNIPPET_ROLE = Qt.ItemDataRole.UserRole + 1
UNDO_SECONDS = 10
INSTANT_SEARCH_S = 0.05
SEARCH_PAUSE_MS = 300


class _SnippetDelegate(QStyledItemDelegate):
    """Draws a second, grey line with the matching text under a title while searching."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        snippet = index.data(SNIPPET_ROLE)
        if not snippet:
            super().paint(painter, option, index)
            return
        title_option = QStyleOptionViewItem(option)
        self.initStyleOption(title_option, index)
        line = option.fontMetrics.lineSpacing()
        title_option.rect = option.rect.adjusted(0, 0, 0, -line)
        style = option.widget.style() if option.widget else None
        if style is not None:
            style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelItemViewItem, option, painter, option.widget)
        title_option.backgroundBrush = Qt.GlobalColor.transparent
        super().paint(painter, title_option, index)
        painter.save()
        painter.setPen(option.palette.placeholderText().color())
        snippet_rect = option.rect.adjusted(6, option.rect.height() - line - 2, -4, 0)
        text = option.fontMetrics.elidedText(snippet, Qt.TextElideMode.ElideRight, snippet_rect.width())
        painter.drawText(snippet_rect, Qt.AlignmentFlag.AlignLeft, text)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        size = super().sizeHint(option, index)
        if index.data(SNIPPET_ROLE):
            size.setHeight(size.height() + option.fontMetrics.lineSpacing() + 2)
        return size


class Sidebar(QWidget):
    sig_conversation_selected = Signal(int)
    sig_new_requested = Signal()
    sig_conversation_renamed = Signal(int, str)
    sig_delete_requested = Signal(int)
    sig_undo_requested = Signal(int)
    sig_export_requested = Signal(int, str)  # conversation id, format
    sig_search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._on_search_edited)
        # A search that answers at once runs at every keystroke; a slow one (many chats: 0.3 s
        # a keystroke with 20,000) waits until typing pauses, so the box keeps up with the keys.
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_PAUSE_MS)
        self._search_timer.timeout.connect(self._search_now)
        self._search_seconds = 0.0
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.sig_new_requested)
        self.list = QListWidget()
        self.list.setItemDelegate(_SnippetDelegate(self.list))
        # A long title ends in "…" (the view's elide mode) within the sidebar's width, instead
        # of widening the list under a horizontal scroll bar.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._show_menu)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_changed)
        self._deferred: tuple[list[ConversationSummary], int | None] | None = None
        # Queued: the list is refilled once the view has finished closing the editor.
        self.list.itemDelegate().closeEditor.connect(self._fill_deferred, Qt.ConnectionType.QueuedConnection)
        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.list)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(lambda: self._request_delete(self.current_id()))

        self.undo_label = QLabel()
        self.undo_label.setTextFormat(Qt.TextFormat.PlainText)  # it quotes a title: the user's text, never markup
        self.undo_label.setWordWrap(True)
        self.undo_button = QPushButton("Undo")
        self.undo_button.clicked.connect(self._undo)
        self.undo_bar = QFrame()
        self.undo_bar.setFrameShape(QFrame.Shape.StyledPanel)
        undo_layout = QHBoxLayout(self.undo_bar)
        undo_layout.setContentsMargins(6, 4, 6, 4)
        undo_layout.addWidget(self.undo_label, 1)
        undo_layout.addWidget(self.undo_button)
        self.undo_bar.setVisible(False)
        self._undo_id: int | None = None
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(UNDO_SECONDS * 1000)
        self._undo_timer.timeout.connect(lambda: self.undo_bar.setVisible(False))

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 0, 6)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.undo_bar)
        self._filling = False

    def set_conversations(self, summaries: list[ConversationSummary], current_id: int | None) -> None:
        if self.list.state() == QAbstractItemView.State.EditingState:
            # Refilled now, the list would close the editor and lose the name being typed (a reply
            # ending mid-rename refreshes it): the latest list waits for the editor to close.
            self._deferred = (summaries, current_id)
            return
        # Newer than any list still waiting for the editor to close: replayed after this one, that
        # list would select the chat it held as current, not the one now shown.
        self._deferred = None
        self._filling = True
        if self._shows(summaries):
            # Most refreshes change nothing listed (one action often refreshes twice); refilled,
            # 20,000 chats took 0.2 s each time.
            rows = [row for row, summary in enumerate(summaries) if summary.id == current_id]
            self.list.setCurrentRow(rows[0] if rows else -1)
            self._filling = False
            return
        self.list.clear()
        for summary in summaries:
            item = QListWidgetItem(summary.title)
            item.setData(ID_ROLE, summary.id)
            item.setData(SNIPPET_ROLE, summary.snippet)
            item.setToolTip(plain_tooltip(summary.snippet or summary.title))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if summary.id == current_id:
                self.list.setCurrentItem(item)
        self._filling = False

    def _shows(self, summaries: list[ConversationSummary]) -> bool:
        """Whether the list shows exactly ``summaries`` (a failed rename leaves an item's text
        other than its stored title: then it does not)."""
        if self.list.count() != len(summaries):
            return False
        return all(
            (item.data(ID_ROLE), item.text(), item.data(SNIPPET_ROLE)) == (summary.id, summary.title, summary.snippet)
            for item, summary in ((self.list.item(row), summary) for row, summary in enumerate(summaries))
        )

    def _fill_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self.set_conversations(*deferred)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return None if item is None else int(item.data(ID_ROLE))

    def ids(self) -> list[int]:
        return [int(self.list.item(row).data(ID_ROLE)) for row in range(self.list.count())]

    def _on_search_edited(self) -> None:
        if self._search_seconds < INSTANT_SEARCH_S:
            self._search_now()
        else:
            self._search_timer.start()

    def _search_now(self) -> None:
        began = time.perf_counter()
        self.sig_search_changed.emit(self.search.text())
        self._search_seconds = time.perf_counter() - began

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def start_rename(self, conversation_id: int) -> None:
        for row in range(self.list.count()):
            if int(self.list.item(row).data(ID_ROLE)) == conversation_id:
                self.list.editItem(self.list.item(row))

    def show_undo(self, conversation_id: int, title: str) -> None:
        self._undo_id = conversation_id
        self.undo_label.setText(f"Deleted “{title}”")
        self.undo_bar.setVisible(True)
        self._undo_timer.start()

    def _undo(self) -> None:
        self.undo_bar.setVisible(False)
        if self._undo_id is not None:
            self.sig_undo_requested.emit(self._undo_id)
            self._undo_id = None

    def _request_delete(self, conversation_id: int | None) -> None:
        if conversation_id is not None:
            self.sig_delete_requested.emit(conversation_id)

    def _on_current_changed(self, item: QListWidgetItem | None) -> None:
        if item is not None and not self._filling:
            self.sig_conversation_selected.emit(int(item.data(ID_ROLE)))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling:
            self.sig_conversation_renamed.emit(int(item.data(ID_ROLE)), item.text())

    def context_menu(self, conversation_id: int) -> QMenu:
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.start_rename(conversation_id))
        export = menu.addMenu("Export as")
        for fmt, name in FORMAT_NAMES.items():
            export.addAction(f"{name}…", lambda fmt=fmt: self.sig_export_requested.emit(conversation_id, fmt))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self._request_delete(conversation_id))
        return menu

    def _show_menu(self, position: QPoint) -> None:
        item = self.list.itemAt(position)
        if item is not None:
            menu = self.context_menu(int(item.data(ID_ROLE)))
            menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            menu.popup(self.list.viewport().mapToGlobal(position))
