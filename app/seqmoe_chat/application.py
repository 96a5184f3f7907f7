"""Starting the app: the Qt application, the data folder, the database, the engine worker."""

from __future__ import annotations

import gc
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyqtgraph.util.garbage_collector import GarbageCollector
from PySide6.QtCore import QLockFile, QSize
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from . import dialogs, long_lived
from .app_metadata import APP_ID, APP_TITLE, ICON_SIZES, app_version, icon_png
from .engine_client import EngineClient
from .paths import config_dir, data_dir, folder_problem
from .store import (
    DATABASE_NAME,
    ConversationStore,
    DatabaseUnavailable,
    OpenedDatabase,
    Settings,
    SettingsStore,
    open_database,
)
from .store.settings import SETTINGS_NAME
from .worker import EngineOpener, open_engine

LOG_NAME = "seqmoe-chat.log"
INSTANCE_LOCK_NAME = "seqmoe-chat.lock"
GC_INTERVAL_S = 1.0


@dataclass
class AppContext:
    """What the main window works with; tests build one with a fake engine."""

    data_dir: Path
    database: OpenedDatabase
    store: ConversationStore
    settings_store: SettingsStore
    settings: Settings
    client: EngineClient


def open_context(folder: Path, opener: EngineOpener = open_engine) -> AppContext:
    database = open_database(folder / DATABASE_NAME)
    store = ConversationStore(database.connection)
    store.mark_interrupted()
    # Deleted conversations could be restored until the app ended; now they go.
    store.purge_deleted()
    settings_store = SettingsStore(config_dir(folder) / SETTINGS_NAME, database.connection)
    return AppContext(folder, database, store, settings_store, settings_store.load(), EngineClient(opener))


def create_application() -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName(APP_TITLE)
    app.setApplicationDisplayName(APP_TITLE)
    app.setApplicationVersion(app_version())
    # Wayland finds the window's desktop entry, and so its icon, by this name.
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(_app_icon())
    return app


@contextmanager
def garbage_collected_on_this_thread() -> Iterator[None]:
    """Collect reference cycles only on this (the GUI) thread, on a timer of its event loop.

    Python collects on whichever thread happens to allocate, and the engine's thread allocates
    most. A collection there may finalise the window's Qt objects (widgets held in reference
    cycles, message views and pyqtgraph's among them), whose destructor then waits for the
    interpreter lock while holding Qt's, as the GUI thread waits for Qt's: a deadlock. The timer
    is pyqtgraph's, which keeps Python's thresholds. Needs the QApplication."""
    was_enabled = gc.isenabled()
    collector = GarbageCollector(interval=GC_INTERVAL_S)
    try:
        yield
    finally:
        # With collection on, any allocation may collect, Qt's locks held: the timer's own
        # disconnection as it is destroyed collected a leftover widget, whose destructor then waited
        # for the lock the disconnection held (a hang at exit). So the garbage goes first, then
        # the timer, and only then does collection come back on.
        collector.timer.stop()
        long_lived.thaw()  # what it froze is garbage too, once the app is done with it
        gc.collect()
        del collector
        if was_enabled:
            gc.enable()


def _app_icon() -> QIcon:
    icon = QIcon()
    for size in ICON_SIZES:
        icon.addFile(str(icon_png(size)), QSize(size, size))
    return icon


def run_app(data_dir_override: Path | None, model: str | None) -> int:
    from .main_window import MainWindow

    app = create_application()
    folder = data_dir(data_dir_override)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(
            filename=folder / LOG_NAME, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # One app per data folder: a second one's start would end the first one's work (its
        # undoable deletions purged, its streaming reply marked interrupted). Held until the app
        # ends; Qt takes over a lock whose process is gone.
        instance = QLockFile(str(folder / INSTANCE_LOCK_NAME))
        if not instance.tryLock(0) and instance.error() == QLockFile.LockError.LockFailedError:
            dialogs.show_fatal(f"{APP_TITLE} is already running",
                               f"{APP_TITLE} is already running with the data folder {folder}; use its window.\n\n"
                               "To run another, give it another folder with --data-dir.")
            return 1
        context = open_context(folder)
    except DatabaseUnavailable as error:
        dialogs.show_fatal(f"{APP_TITLE} cannot start", str(error))
        return 1
    except (OSError, sqlite3.Error) as error:
        # Started from a desktop entry, a traceback on stderr is seen by nobody.
        dialogs.show_fatal(f"{APP_TITLE} cannot start",
                           f"Its data folder {folder} cannot be used: {folder_problem(error)}.\n\nMake it a writable "
                           "folder, or choose another with --data-dir or the SEQMOE_CHAT_DATA_DIR environment variable.")
        return 1
    with garbage_collected_on_this_thread():
        window = MainWindow(context, model)
        window.show()
        window.start()
        return leave(window.context.client, app.exec())


def leave(client: EngineClient, code: int) -> int:
    """``code``, once the window has closed. An engine still inside one step that no cancel
    reaches (a shard being read, a long prefill) when its wait ran out would make Qt abort the
    process as its thread object is destroyed; the chats are saved as they go, so the process
    ends at once instead, with ``code``."""
    if client.thread_running:
        logging.getLogger(__name__).warning("the engine did not stop in time; the app quits without waiting for it")
        logging.shutdown()
        os._exit(code)
    return code
