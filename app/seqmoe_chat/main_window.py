"""The main window: conversations on the left, the chat in the middle, the model in the
toolbar, its figures in the status bar. It wires the widgets to the chat session and the
engine client and owns the menus and shortcuts."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, Slot
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QMainWindow, QMenu, QSplitter, QVBoxLayout, QWidget

from . import dialogs, export_destination
from .application import APP_TITLE, AppContext
from .chat_header import ChatHeader
from .chat_session import ChatSession
from .chat_view import ChatView
from .composer import Composer
from .conversation_dialog import ConversationDialog
from .engine_settings import engine_context
from .model_bar import ModelBar
from .model_manager.dialog import ModelsDialog
from .model_manager.manager import ModelManager
from .models.library import BUNDLED
from .models.model_folders import models_dir
from .panel.dock import TelemetryDock
from .settings_dialog import SettingsDialog
from .sidebar import Sidebar
from .status_bar import StatusBar
from .store import EngineOptions, Message
from .store.conversations import DEFAULT_TITLE
from .store.records import ASSISTANT
from .store.settings import THEMES
from .theme import apply_theme
from .export_task import ExportTask
from .background import run_in_background
from .transcripts.json_format import TranscriptError, read_json
from .transcripts.transcript import Transcript, load_transcripts, store_transcripts
from .worker import ModelInfo

log = logging.getLogger(__name__)

STATUS_MESSAGE_MS = 6000


class MainWindow(QMainWindow):
    def __init__(self, context: AppContext, model: str | None = None) -> None:
        super().__init__()
        self.context = context
        self.store = context.store
        self.settings = context.settings
        self.client = context.client
        self.session = ChatSession(self.store, self.client, self)
        self.session.default_sampling = self.settings.sampling
        self.setWindowTitle(APP_TITLE)

        self.sidebar = Sidebar()
        self.header = ChatHeader()
        self.chat = ChatView()
        self.composer = Composer()
        centre = QWidget()
        centre_layout = QVBoxLayout(centre)
        centre_layout.setContentsMargins(0, 0, 0, 0)
        centre_layout.setSpacing(0)
        centre_layout.addWidget(self.header)
        centre_layout.addWidget(self.chat, 1)
        centre_layout.addWidget(self.composer)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(centre)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 940])
        self.setCentralWidget(self.splitter)
        self.model_bar = ModelBar()
        toolbar = self.model_toolbar = self.addToolBar("Model")
        toolbar.setObjectName("modelToolbar")
        toolbar.setMovable(False)
        toolbar.addWidget(self.model_bar)
        self.status = StatusBar()
        self.setStatusBar(self.status)
        self.panel = TelemetryDock(self.client, self.settings.panel_hz, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.panel)

        self.models = ModelManager(context.data_dir, self._model_in_use, parent=self)
        self.export_task = ExportTask(self)
        self._kept_options: dict[int, EngineOptions] = {}  # by reconfigure request: the options before it
        self.export_task.sig_finished.connect(self._on_exported)
        self.export_task.sig_failed.connect(self._on_export_failed)
        self.importing: Path | None = None  # the file being read for an import, off the GUI thread
        self._models_dialog: ModelsDialog | None = None
        self._load_id: int | None = None
        self._load_options = EngineOptions()  # what the load asked for last runs with
        self._speed_from: tuple[int, float] | None = None  # tokens and time of the reply's first streamed text
        self._model = self.settings.model if model is None else model
        self._loaded_model = ""  # as _model gave it, for the model loaded now
        self.model_bar.set_models(self.settings.recent_models, self._model)
        self._build_actions()
        self._build_menus()
        self._connect()
        self._restore_layout()
        apply_theme(QApplication.instance(), self.settings.theme)
        summaries = self.store.summaries()
        self.session.open(summaries[0].id if summaries else None)

    def start(self) -> None:
        """After the window is shown: report a database or settings file that had to be replaced,
        load the model."""
        if self.context.database.notice:
            dialogs.show_error(self, "Chat database replaced", self.context.database.notice)
        if self.context.settings_store.notice:
            dialogs.show_error(self, "Settings replaced", self.context.settings_store.notice)
        self.load_model(self._model)
        self.models.start()
        self.composer.input.setFocus()

    # Actions and menus

    def _build_actions(self) -> None:
        def action(text: str, slot, shortcut: QKeySequence | str | None = None, tip: str = "") -> QAction:
            made = QAction(text, self)
            if shortcut is not None:
                made.setShortcut(QKeySequence(shortcut))
            made.setStatusTip(tip)
            made.triggered.connect(slot)
            self.addAction(made)
            return made

        self.action_new = action("&New Chat", self.new_conversation, QKeySequence.StandardKey.New)
        self.action_import = action("&Import…", self.import_conversations, tip="Add conversations from a JSON export")
        self.action_export = action("&Export Conversation…", self.export_current, "Ctrl+E")
        self.action_export_all = action("Export &All Conversations…", lambda: self.export(self.store_ids(), None))
        self.action_settings = action("&Settings…", self.open_settings, QKeySequence.StandardKey.Preferences)
        self.action_quit = action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.action_find = action("&Find Chats", self.sidebar.focus_search, QKeySequence.StandardKey.Find)
        self.action_stop = action("&Stop", self.session.stop, "Esc", "Stop the reply")
        self.action_regenerate = action("&Regenerate", self.regenerate_last, "Ctrl+R")
        self.action_conversation_settings = action("&Prompt and Sampling…", self.edit_conversation_settings)
        self.action_rename = action("Re&name", self.rename_current, "F2")
        self.action_delete = action("&Delete", lambda: self.delete_conversation(self.session.conversation_id))
        self.action_load = action("&Load Model", lambda: self.load_model(self.model_bar.chosen_model()))
        self.action_unload = action("&Unload Model", self.client.unload)
        self.action_cancel_load = action("&Cancel Loading", self.client.cancel_load)
        self.action_models = action("&Models…", self.open_models, tip="Download, manage and calibrate models")
        # Beside the model bar, not in it: a narrow window moves it to the toolbar's overflow menu.
        self.model_toolbar.addAction(self.action_models)
        self.action_stop.setEnabled(False)
        self.theme_actions = QActionGroup(self)
        for theme in THEMES:
            themed = self.theme_actions.addAction(theme.capitalize())
            themed.setCheckable(True)
            themed.setChecked(theme == self.settings.theme)
            themed.triggered.connect(lambda _checked=False, theme=theme: self.set_theme(theme))

    def _build_menus(self) -> None:
        bar = self.menuBar()
        _fill(bar.addMenu("&File"), self.action_new, None, self.action_import, self.action_export,
              self.action_export_all, None, self.action_settings, None, self.action_quit)
        _fill(bar.addMenu("&Chat"), self.action_stop, self.action_regenerate, self.action_conversation_settings, None,
              self.action_find, self.action_rename, self.action_delete)
        _fill(bar.addMenu("&Model"), self.action_models, None, self.action_load, self.action_unload, self.action_cancel_load)
        view_menu = bar.addMenu("&View")
        _fill(view_menu, self.panel.toggleViewAction())
        _fill(view_menu.addMenu("&Theme"), *self.theme_actions.actions())

    def _connect(self) -> None:
        sidebar, session, worker = self.sidebar, self.session, self.client.worker
        sidebar.sig_conversation_selected.connect(session.open)
        sidebar.sig_new_requested.connect(self.new_conversation)
        sidebar.sig_conversation_renamed.connect(self._rename)
        sidebar.sig_delete_requested.connect(self.delete_conversation)
        sidebar.sig_undo_requested.connect(self._undo_delete)
        sidebar.sig_export_requested.connect(lambda cid, fmt: self.export([cid], fmt))
        sidebar.sig_search_changed.connect(self.refresh_conversations)
        session.sig_thread_changed.connect(self._show_thread)
        session.sig_message_added.connect(self._on_message_added)
        session.sig_reply_streamed.connect(self._on_reply_streamed)
        session.sig_message_changed.connect(self._on_message_changed)
        session.sig_busy_changed.connect(self._on_busy_changed)
        session.sig_conversations_changed.connect(self.refresh_conversations)
        session.sig_model_needed.connect(lambda: self.load_model(self.model_bar.chosen_model()))
        session.sig_save_failed.connect(self._on_save_failed)
        self.chat.sig_edit_submitted.connect(session.resend_edited)
        self.chat.sig_regenerate_requested.connect(session.regenerate)
        self.chat.sig_version_requested.connect(self._select_version)
        self.header.sig_settings_requested.connect(self.edit_conversation_settings)
        self.composer.sig_message_submitted.connect(self._send)
        self.composer.sig_stop_requested.connect(session.stop)
        self.model_bar.sig_load_requested.connect(self.load_model)
        self.model_bar.sig_unload_requested.connect(self.client.unload)
        self.model_bar.sig_load_cancel_requested.connect(self.client.cancel_load)
        self.model_bar.sig_state_shown.connect(self._show_model_state_in_menu)
        self._show_model_state_in_menu(loading=False, loaded=False)
        self.models.sig_library_changed.connect(self._on_library_changed)
        self.models.sig_model_deleted.connect(self._on_model_deleted)
        self.models.sig_download_finished.connect(
            lambda entry: self.status.showMessage(f"{entry.repo_id} is downloaded; it is in the model list.", STATUS_MESSAGE_MS))
        worker.sig_load_progressed.connect(self._on_load_progressed)
        worker.sig_model_loaded.connect(self._on_model_loaded)
        worker.sig_load_failed.connect(self._on_load_failed)
        worker.sig_load_cancelled.connect(self._on_load_cancelled)
        worker.sig_model_unloaded.connect(self._on_model_unloaded)
        worker.sig_model_reconfigured.connect(self._on_model_reconfigured)
        worker.sig_reconfigure_failed.connect(self._on_reconfigure_failed)
        QApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)

    # Conversations

    def store_ids(self) -> list[int]:
        return [summary.id for summary in self.store.summaries()]

    @Slot()
    def refresh_conversations(self) -> None:
        self.sidebar.set_conversations(self.store.summaries(self.sidebar.search.text()), self.session.conversation_id)
        conversation_id = self.session.conversation_id
        conversation = self.store.get(conversation_id) if conversation_id and self.store.exists(conversation_id) else None
        self.header.show_conversation(conversation)
        # Qt adds the application's display name to the title on its own, and shows "[*]" only when
        # the window is modified; doubled, it shows one "[*]" (a title can hold it).
        self.setWindowTitle(conversation.title.replace("[*]", "[*][*]") if conversation else APP_TITLE)

    def new_conversation(self) -> None:
        with self._changing_chats("Starting a new chat"):
            self.session.new_conversation()
        self.composer.input.setFocus()

    def _select_version(self, message_id: int) -> None:
        with self._changing_chats("Showing another version"):
            self.session.select_version(message_id)

    def rename_current(self) -> None:
        if self.session.conversation_id is not None:
            self.sidebar.start_rename(self.session.conversation_id)

    @contextlib.contextmanager
    def _changing_chats(self, change: str) -> Iterator[None]:
        """Around a change of the conversations; one the database refuses (a full disk, a lock
        held too long) is said, and the list shows the conversations as they are stored."""
        try:
            yield
        except sqlite3.Error as error:
            dialogs.show_error(self, f"{change} failed", f"The chat database refused it ({error}); nothing changed. "
                               f"Free some disk space, or check that {self.context.data_dir} can be written.")
            self.refresh_conversations()

    def _rename(self, conversation_id: int, title: str) -> None:
        with self._changing_chats("Renaming the conversation"):
            self.store.rename(conversation_id, title)
            self.refresh_conversations()

    def delete_conversation(self, conversation_id: int | None) -> None:
        if conversation_id is None or not self.store.exists(conversation_id):
            return
        if self.session.busy and self.session.active_conversation_id == conversation_id:
            self.session.stop()
        title = self.store.get(conversation_id).title
        with self._changing_chats("Deleting the conversation"):
            self.store.delete(conversation_id)
            self.sidebar.show_undo(conversation_id, title)
            if conversation_id == self.session.conversation_id:
                remaining = self.store_ids()
                self.session.open(remaining[0] if remaining else None)  # refreshes the list with the thread
            else:
                self.refresh_conversations()

    def _undo_delete(self, conversation_id: int) -> None:
        with self._changing_chats("Restoring the conversation"):
            self.store.restore(conversation_id)
            self.session.open(conversation_id)  # refreshes the list with the thread

    def edit_conversation_settings(self) -> None:
        """The shown conversation's prompt and sampling; with none shown, those of a new one,
        made only when the dialog is accepted."""
        shown = self.session.conversation_id
        conversation = self.store.get(shown) if shown is not None and self.store.exists(shown) else None
        if conversation is None:
            dialog = ConversationDialog(DEFAULT_TITLE, "", self.session.default_sampling, self)
        else:
            dialog = ConversationDialog(conversation.title, conversation.system_prompt, conversation.sampling, self)
        if dialog.exec():
            with self._changing_chats("Saving the conversation's settings"):
                self.store.configure(self.session.new_conversation() if conversation is None else conversation.id,
                                     *dialog.values())
                self.refresh_conversations()

    def regenerate_last(self) -> None:
        if self.session.conversation_id is None or self.session.busy:
            return
        thread = self.store.thread(self.session.conversation_id)
        if thread and thread[-1].message.role == ASSISTANT:
            self.session.regenerate(thread[-1].message.id)

    def _send(self, text: str) -> None:
        if self.session.send(text):
            self.composer.clear()

    def _on_save_failed(self, reason: str) -> None:
        dialogs.show_error(
            self, "The chat could not be saved",
            f"The chat database refused a write ({reason}). Replies stay on screen and are saved with "
            f"the next write that succeeds; a message that could not be saved stays in the box below. "
            f"Free some disk space, or check that {self.context.data_dir} can be written.",
        )

    def _show_thread(self) -> None:
        conversation_id = self.session.conversation_id
        exists = conversation_id is not None and self.store.exists(conversation_id)
        self.chat.show_thread(self.session.thread(conversation_id) if exists else [], self.session.busy)
        self.refresh_conversations()

    def _on_message_added(self, message: Message) -> None:
        if message.conversation_id == self.session.conversation_id:
            self.chat.append(message)

    def _on_reply_streamed(self, message_id: int, text: str, tokens: int) -> None:
        self.chat.stream(message_id, text)
        now = time.monotonic()
        # Timed from the first text on, as the finished reply's speed is from its first token.
        if self._speed_from is None:
            self._speed_from = (tokens, now)
        else:
            self.status.show_speed(tokens - self._speed_from[0], now - self._speed_from[1])

    def _on_message_changed(self, message: Message) -> None:
        self.chat.update_message(message)
        self.status.show_reply_stats(message.stats)

    def _on_busy_changed(self, busy: bool) -> None:
        self.composer.set_busy(busy)
        self.chat.set_busy(busy)
        self.action_stop.setEnabled(busy)
        if busy:
            self._speed_from = None

    # Export and import

    def export_current(self) -> None:
        if self.session.conversation_id is not None and self.store.exists(self.session.conversation_id):
            self.export([self.session.conversation_id], None)

    def export(self, conversation_ids: list[int], fmt: str | None) -> None:
        if not conversation_ids:
            self.status.showMessage("There is nothing to export yet.", STATUS_MESSAGE_MS)
            return
        name = self.store.get(conversation_ids[0]).title if len(conversation_ids) == 1 else "SeqMoE Chat conversations"
        target = dialogs.ask_export_path(self, _file_name(name), fmt)
        if target is None:
            return
        path, chosen = target
        # The dialog has asked before replacing a file; what no export may replace is refused still.
        refused = export_destination.refusal(path, self.context.database.path, force=True)
        if refused:
            dialogs.show_error(self, "Export refused", refused)
            return
        if self.export_task.running:
            self.status.showMessage("The last export is still being written; try again when it is done.", STATUS_MESSAGE_MS)
            return
        self.export_task.start(path, load_transcripts(self.store, conversation_ids), chosen)
        self.status.showMessage(f"Exporting {len(conversation_ids)} conversation(s) to {path}…")

    def _on_exported(self, path: str, count: int) -> None:
        self.status.showMessage(f"Exported {count} conversation(s) to {path}", STATUS_MESSAGE_MS)

    def _on_export_failed(self, reason: str) -> None:
        self.status.clearMessage()
        dialogs.show_error(self, "Export failed", reason)

    def import_conversations(self) -> None:
        path = dialogs.ask_import_path(self)
        if path is None:
            return
        if self.importing is not None:
            self.status.showMessage("The last import is still being read; try again when it is done.", STATUS_MESSAGE_MS)
            return
        # Read off the GUI thread (decoding and checking 59 MB held the window still for 2.5 s);
        # stored on it, where the database connection is.
        self.importing = path
        run_in_background(lambda: read_json(path), lambda read: self._on_import_read(path, read),
                          lambda error: self._on_import_failed(path, error), self)
        self.status.showMessage(f"Importing conversations from {path.name}…")

    def _import_ended(self, path: Path) -> bool:
        """Whether the end of reading ``path`` is still wanted (the window closed meanwhile: not)."""
        if self.importing != path:
            return False
        self.importing = None
        self.status.clearMessage()  # also when the database refuses them
        return True

    def _on_import_read(self, path: Path, transcripts: list[Transcript]) -> None:
        if not self._import_ended(path):
            return
        with self._changing_chats("Importing conversations"):
            ids = store_transcripts(self.store, transcripts)
            if ids:
                self.session.open(ids[0])
            self.status.showMessage(f"Imported {len(ids)} conversation(s) from {path.name}", STATUS_MESSAGE_MS)

    def _on_import_failed(self, path: Path, error: Exception) -> None:
        if not self._import_ended(path):
            return
        if isinstance(error, OSError):
            reason = error.strerror or str(error)
        else:
            if not isinstance(error, TranscriptError):  # a bug in the checks, but no reason to stay at "Importing…"
                log.error("reading %s failed", path, exc_info=error)
            reason = str(error)
        dialogs.show_error(self, "Import failed", f"{path.name} could not be imported: {reason}")

    # The model

    def _model_in_use(self) -> str | None:
        """The folder or id of the model loaded, or being loaded."""
        if self.client.model is not None:
            return self.client.model.path
        return self._model if self.client.busy_loading else None

    def load_model(self, model: str) -> None:
        self._model = model
        # Settings accepted while it loads apply once it has loaded, as a change from these.
        self._load_options = dataclasses.replace(self.settings.engine)
        self._load_id = self.client.load(model, self._load_options)
        # The worker loads after the reply it is generating: said, so the bar does not sit at 0%.
        self.model_bar.show_loading("Waiting for the reply to end" if self.session.busy else "Starting", 0.0)
        self.status.show_model(None, "Loading the model…")

    def _on_load_progressed(self, request_id: int, stage: str, fraction: float) -> None:
        if request_id == self._load_id:
            self.model_bar.show_loading(stage, fraction)
            self.status.show_model(None, f"Loading: {stage}")

    def _on_model_loaded(self, request_id: int, info: ModelInfo) -> None:
        if request_id == self._load_id:
            self.model_bar.show_loaded(info)
            self.status.show_model(info)
            # Only a model that loads is opened at the next start and listed: a folder that failed
            # would fail again at every start.
            self._loaded_model = self._model
            self.settings.remember_model(self._model)
            self.model_bar.set_models(self.settings.recent_models, self.model_bar.chosen_model())
            self._save_settings()
            self._apply_engine_settings(self._load_options)

    def _on_load_failed(self, request_id: int, reason: str, kept: ModelInfo | None) -> None:
        if request_id != self._load_id:
            return
        if kept is None:
            self.model_bar.show_unloaded()
            self.status.show_model(None, "No model loaded")
            dialogs.show_error(self, "The model could not be loaded", reason)
            return
        self._model = self._loaded_model
        self.model_bar.set_models(self.settings.recent_models, self._model)
        self.model_bar.show_loaded(kept)
        self.status.show_model(kept)
        # Settings accepted during the failed load apply to the model kept (it runs with those of its
        # own load and the changes since; the load's copy stands in for them).
        self._apply_engine_settings(self._load_options)
        dialogs.show_error(self, "The model could not be loaded", f"{reason}\n\n{kept.name} is still loaded.")

    def _on_load_cancelled(self, request_id: int) -> None:
        if request_id == self._load_id:
            self.model_bar.show_unloaded()
            self.status.show_model(None)
            self.status.showMessage("Loading cancelled.", STATUS_MESSAGE_MS)

    def _on_model_unloaded(self) -> None:
        if self.client.busy_loading:  # a load asked for since (a message sent at once) is on its way
            return
        self.model_bar.show_unloaded()
        self.status.show_model(None)

    def _on_model_reconfigured(self, request_id: int, info: ModelInfo) -> None:
        self._kept_options.pop(request_id, None)
        self.status.show_model(info)
        self.status.showMessage(f"Expert cache: {info.cache_slots} of {info.total_experts} experts, policy {info.policy}",
                                STATUS_MESSAGE_MS)

    def _on_reconfigure_failed(self, request_id: int, reason: str, info: ModelInfo) -> None:
        self.status.show_model(info)
        kept = self._kept_options.pop(request_id, None)
        later = [pending for pending in self._kept_options if pending > request_id]
        if kept is not None and later:  # what the engine runs, should the next change be refused too
            self._kept_options[min(later)] = kept
        elif kept is not None:
            # The settings say what the engine runs: kept refused, the model failed to load with
            # them at every start. A device or context chosen since still applies at the next load.
            engine = self.settings.engine
            self.settings.engine = dataclasses.replace(kept, device=engine.device, context_tokens=engine.context_tokens)
            self._save_settings()
        dialogs.show_error(self, "The expert cache was not changed", f"{reason}\n\nThe settings are as they were.")

    def open_models(self) -> None:
        if self._models_dialog is None:
            self._models_dialog = ModelsDialog(self.models, lambda: self.settings.engine, self)
            self._models_dialog.sig_load_requested.connect(self.load_model)
        self._models_dialog.open_tab()

    def _on_library_changed(self, items: list) -> None:
        self.model_bar.set_library([(i.model.name, str(i.model.path)) for i in items
                                    if i.model.source != BUNDLED and not i.model.missing])

    def _on_model_deleted(self, folder: str) -> None:
        # Still listed, or opened at the next start, it would only fail to load.
        self.settings.forget_model(folder)
        chosen = self.model_bar.chosen_model()
        self.model_bar.set_models(self.settings.recent_models, "" if chosen == folder else chosen)
        self._save_settings()

    # Settings, theme, window state

    def open_settings(self) -> None:
        engine = engine_context(self.client.model, self.panel.monitor.current(), self.store.connection)
        folders = {"Data (chats, log)": self.context.data_dir, "Downloaded models": models_dir(self.context.data_dir),
                   "Settings file": self.context.settings_store.path}
        dialog = SettingsDialog(self.settings, self, engine, folders)
        accepted = dialog.exec()
        dialog.deleteLater()  # after this method: apply_to still reads it
        if not accepted:
            return
        before = dataclasses.replace(self.settings.engine)
        dialog.apply_to(self.settings)
        self.session.default_sampling = self.settings.sampling
        self.panel.set_rate(self.settings.panel_hz)
        self.set_theme(self.settings.theme)  # saves the settings
        if self.client.model is not None:
            self._apply_engine_settings(before)
        elif self.client.busy_loading and self.settings.engine != before:
            self.status.showMessage("The engine settings apply once the model has loaded.", STATUS_MESSAGE_MS)

    def _apply_engine_settings(self, before: EngineOptions) -> None:
        """Apply to the loaded model, which runs with ``before``, the engine settings as they are
        now: the cache's policy, size and link at once; the device and context need a new load."""
        after = self.settings.engine
        # Queued on the worker: it applies between two replies, never during one.
        if dataclasses.replace(after, device=before.device, context_tokens=before.context_tokens) != before:
            self._kept_options[self.client.reconfigure(after)] = before
        later = [name for name, changed in (("device", after.device != before.device),
                                            ("context", after.context_tokens != before.context_tokens)) if changed]
        if later:
            verb = "applies" if len(later) == 1 else "apply"
            self.status.showMessage(f"The {' and the '.join(later)} {verb} when the model is next loaded.",
                                    STATUS_MESSAGE_MS)

    def set_theme(self, theme: str) -> None:
        self.settings.theme = theme
        for themed in self.theme_actions.actions():
            themed.setChecked(themed.text().lower() == theme)
        apply_theme(QApplication.instance(), theme)
        self._save_settings()

    def _on_color_scheme_changed(self) -> None:
        if self.settings.theme == "system":
            apply_theme(QApplication.instance(), "system")

    def _restore_layout(self) -> None:
        geometry = QByteArray.fromBase64(self.settings.window_geometry.encode())
        if geometry.isEmpty() or not self.restoreGeometry(geometry):
            self.resize(1200, 780)
        self.restoreState(QByteArray.fromBase64(self.settings.window_state.encode()))
        self.splitter.restoreState(QByteArray.fromBase64(self.settings.splitter_state.encode()))

    def save_layout(self) -> None:
        """Kept for the next start; called as the window closes, so a failure is only logged."""
        self.settings.window_geometry = bytes(self.saveGeometry().toBase64()).decode()
        self.settings.window_state = bytes(self.saveState().toBase64()).decode()
        self.settings.splitter_state = bytes(self.splitter.saveState().toBase64()).decode()
        self._save_settings(report=False)

    def _save_settings(self, report: bool = True) -> None:
        """Write the settings; a folder that refuses them (full, read-only) is logged and, with
        ``report``, shown: the settings still apply until the app quits."""
        store = self.context.settings_store
        try:
            store.save(self.settings)
        except OSError as error:
            log.warning("the settings could not be saved to %s: %s", store.path, error)
            if report:
                dialogs.show_error(self, "The settings could not be saved",
                                   f"{store.path} could not be written ({error.strerror or error}). "
                                   "The settings apply until the app quits.")

    def _show_model_state_in_menu(self, loading: bool, loaded: bool) -> None:
        """The Model menu's actions can act as the model bar's buttons can."""
        self.action_load.setEnabled(not loading)
        self.action_unload.setEnabled(loaded)
        self.action_cancel_load.setEnabled(loading)

    def closeEvent(self, event: QCloseEvent) -> None:
        # Unlike an export, which is finished before the app quits, a file still being read is not
        # imported: nothing is half done, and it can be imported again.
        self.importing = None
        self.session.stop()
        self.models.shut_down()
        self.save_layout()
        self.client.shut_down()
        super().closeEvent(event)


def _fill(menu: QMenu, *actions: QAction | None) -> None:
    """Add ``actions`` to ``menu``; None stands for a separator."""
    for action in actions:
        if action is None:
            menu.addSeparator()
        else:
            menu.addAction(action)


_UNSAFE_IN_FILE_NAMES = re.compile(r'[\\/:*?"<>|\s\x00-\x1f\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]+')
"""Separators, what Windows refuses, control characters, and the marks that reorder text (a
title ending in a right-to-left override would show ``file.exe`` for ``exe.elif``)."""
_WINDOWS_DEVICES = re.compile(r"(?i)(con|prn|aux|nul|com[1-9]|lpt[1-9])(\..*)?")


def _file_name(title: str) -> str:
    """A title made safe as a file name on every platform: file systems count a name's bytes
    (255 at most), so it is cut by its UTF-8 bytes, leaving room for the extension. Windows
    refuses a name that ends in a dot or is a device's (``CON``, ``nul.txt``)."""
    safe = _UNSAFE_IN_FILE_NAMES.sub(" ", title).strip()
    safe = safe.encode()[:120].decode(errors="ignore").strip().rstrip(". ")
    if _WINDOWS_DEVICES.fullmatch(safe):
        safe = f"Chat {safe}"
    return safe or "conversation"
