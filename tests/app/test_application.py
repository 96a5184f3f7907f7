"""Starting and leaving the app: a data folder that cannot be written, one another app runs on and
a database another program holds or a newer version wrote are said, reference cycles are collected on the GUI thread alone, and ending that leaves no Qt lock waiting for itself."""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
import threading
import weakref

import pytest
from PySide6.QtCore import QLockFile
from PySide6.QtWidgets import QLabel

import seqmoe_chat.store.database
from seqmoe_chat import dialogs, main_window
from seqmoe_chat.application import INSTANCE_LOCK_NAME, garbage_collected_on_this_thread, run_app
from seqmoe_chat.store import DATABASE_NAME, ConversationStore, open_database
from seqmoe_chat.store.migrations import SCHEMA_VERSION


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_garbage_made_on_another_thread_is_collected_on_the_gui_thread(qtbot) -> None:
    collected_on: list[threading.Thread] = []

    def record(phase: str, _info: dict) -> None:
        if phase == "start":
            collected_on.append(threading.current_thread())

    gc.callbacks.append(record)
    try:
        with garbage_collected_on_this_thread():
            # The engine's thread allocates far past Python's thresholds while it generates.
            engine = threading.Thread(target=lambda: [Cycle() for _ in range(50_000)])
            engine.start()
            engine.join()
            last = weakref.ref(Cycle())
            qtbot.waitUntil(lambda: last() is None, timeout=5_000)
    finally:
        gc.callbacks.remove(record)
    assert collected_on and set(collected_on) == {threading.main_thread()}


def test_what_lives_on_after_a_model_change_is_left_out_of_collections_until_the_next(qtbot, make_window) -> None:
    # Every full collection walked PyTorch's, transformers' and the model's 400,000 objects on the
    # GUI thread: 180-230 ms, a stutter in a streaming reply.
    window = make_window()  # the demo model loaded
    kept = Cycle()
    held = weakref.ref(kept)
    window.load_model("/models/other-moe")
    qtbot.waitUntil(lambda: window.client.model is not None and window.client.model.path == "/models/other-moe",
                    timeout=5000)
    assert gc.get_freeze_count() > 0
    del kept  # now garbage, in a cycle, but frozen with what was alive at the change
    gc.collect()
    assert held() is not None
    window.client.unload()  # the next change collects it: nothing stays frozen for good
    qtbot.waitUntil(lambda: held() is None, timeout=5000)


# Widgets left in reference cycles (as a closed window leaves them), each with a connected
# action, and Python collecting at every allocation: when collection came back on before the
# collector's timer was destroyed, the timer's disconnection collected a widget whose
# destructor waited for the lock the disconnection held.
LEFTOVER_WIDGETS_AT_EXIT = """
import gc
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QWidget
from seqmoe_chat import dialogs
from seqmoe_chat.application import garbage_collected_on_this_thread, run_app
app = QApplication([])
gc.set_threshold(1)
with garbage_collected_on_this_thread():
    for _ in range(400):
        widget = QWidget()
        action = QAction("x", widget)
        action.triggered.connect(widget.close)
        widget.cycle = widget
        del widget, action
print("ended")
"""


def test_ending_the_gui_threads_collection_with_widgets_left_in_cycles_does_not_hang() -> None:
    try:
        result = subprocess.run([sys.executable, "-c", LEFTOVER_WIDGETS_AT_EXIT], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("ending the collection on the GUI thread hung") from None
    assert result.returncode == 0 and result.stdout.strip() == "ended", result.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 on")
def test_qt_calls_that_return_nothing_leave_nones_references_alone(qtbot) -> None:
    # PySide6 6.12.0 took one at every such call: the app, calling thousands a second while a
    # reply streams, aborted with "deallocating None" within a minute or two.
    label = QLabel()
    qtbot.addWidget(label)
    before = sys.getrefcount(None)
    for _ in range(2000):
        label.setText("streamed text")
    assert sys.getrefcount(None) > before - 100


def test_a_data_folder_that_cannot_be_written_is_said_and_the_app_ends(qtbot, tmp_path, monkeypatch) -> None:
    # Started from a desktop entry, the traceback it gave went nowhere anyone looks.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    shown: list[str] = []
    monkeypatch.setattr(dialogs, "show_fatal", lambda title, text: shown.append(text))
    assert run_app(blocker / "data", None) == 1
    assert shown == [f"Its data folder {blocker / 'data'} cannot be used: Not a directory.\n\nMake it a writable folder, "
                     "or choose another with --data-dir or the SEQMOE_CHAT_DATA_DIR environment variable."]
    # A file given as the folder itself read "cannot be written: File exists".
    shown.clear()
    assert run_app(blocker, None) == 1
    assert shown[0].startswith(f"Its data folder {blocker} cannot be used: it is not a folder.")


def test_a_second_app_on_the_same_data_folder_says_the_first_runs_and_leaves_its_chats_alone(
    qtbot, tmp_path, monkeypatch
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    first = QLockFile(str(folder / INSTANCE_LOCK_NAME))
    assert first.tryLock(0)  # the app that runs
    shown: list[str] = []
    monkeypatch.setattr(dialogs, "show_fatal", lambda title, text: shown.append(title))
    assert run_app(folder, None) == 1
    assert shown == ["SeqMoE Chat is already running"] and not (folder / DATABASE_NAME).exists()
    first.unlock()


def test_a_chat_database_another_program_holds_is_said_and_left_where_it_is(qtbot, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "data"
    opened = open_database(folder / DATABASE_NAME)
    ConversationStore(opened.connection).create("Keep me")
    opened.connection.close()
    holder = sqlite3.connect(folder / DATABASE_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    shown: list[str] = []
    monkeypatch.setattr(dialogs, "show_fatal", lambda title, text: shown.append(text))
    monkeypatch.setattr(seqmoe_chat.store.database, "BUSY_TIMEOUT_S", 0.1)
    assert run_app(folder, None) == 1
    holder.close()
    assert len(shown) == 1 and "is in use by another program" in shown[0]
    assert not list(folder.glob("*.broken-*"))
    assert [s.title for s in ConversationStore(open_database(folder / DATABASE_NAME).connection).summaries()] == ["Keep me"]


def _no_window(*_args: object) -> None:
    raise AssertionError("the app started")


def test_a_chat_database_a_newer_version_wrote_is_said_and_left_as_it_is(qtbot, tmp_path, monkeypatch) -> None:
    # Moved aside, the app started with an empty one, which the newer version then opened: chats gone.
    folder = tmp_path / "data"
    opened = open_database(folder / DATABASE_NAME)
    ConversationStore(opened.connection).create("Keep me")
    opened.connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    opened.connection.close()
    before = (folder / DATABASE_NAME).read_bytes()
    shown: list[str] = []
    monkeypatch.setattr(dialogs, "show_fatal", lambda title, text: shown.append(text))
    monkeypatch.setattr(main_window, "MainWindow", _no_window)  # a window on the empty one would wait for its user
    assert run_app(folder, None) == 1
    assert len(shown) == 1 and "was written by a newer SeqMoE Chat" in shown[0]
    assert (folder / DATABASE_NAME).read_bytes() == before and not list(folder.glob("*.broken-*"))
