"""``seqmoe-chat --self-test``: the whole app, headless, for packagers and CI.

It opens the window offscreen with a temporary data folder, loads the default model,
sends one message through the input box, waits for the reply, exports the conversation
to Markdown and checks the file. One line says how it went; the exit status is 0 or 1.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QtMsgType, QTimer, qInstallMessageHandler

from .application import create_application, garbage_collected_on_this_thread, open_context
from .main_window import MainWindow
from .store.records import DONE
from .transcripts.export import write_export
from .transcripts.reply_stats import generating
from .transcripts.transcript import load_transcripts

MESSAGE = "Hello! What do you like to do on weekends?"
LOAD_TIMEOUT_S = 600
REPLY_TIMEOUT_S = 600


class SelfTestFailed(Exception):
    pass


def run_self_test(model: str | None = None) -> int:
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The result is one line: no download or loading bars around it.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with tempfile.TemporaryDirectory(prefix="seqmoe-chat-self-test-") as folder:
            summary = _chat_once(Path(folder), model)
    except SelfTestFailed as failure:
        print(f"seqmoe-chat self-test: FAILED: {failure}", flush=True)
        return 1
    except Exception as error:  # the self-test reports every failure as its one line
        print(f"seqmoe-chat self-test: FAILED: {type(error).__name__}: {error}", flush=True)
        return 1
    print(f"seqmoe-chat self-test: OK: {summary}", flush=True)
    return 0


def _chat_once(folder: Path, model: str | None) -> str:
    previous_handler = _show_only_qt_errors()
    try:
        create_application()
        with garbage_collected_on_this_thread():
            return _chat_in_window(folder, model)
    finally:
        qInstallMessageHandler(previous_handler)


def _chat_in_window(folder: Path, model: str | None) -> str:
    context = open_context(folder)
    window = MainWindow(context, model)
    failures: list[str] = []
    context.client.worker.sig_load_failed.connect(lambda _id, reason, _kept: failures.append(reason))
    try:
        window.show()
        window.start()
        if not _wait_until(lambda: context.client.model is not None or bool(failures), LOAD_TIMEOUT_S):
            raise SelfTestFailed(f"the model did not load within {LOAD_TIMEOUT_S} s")
        if failures:
            raise SelfTestFailed(f"the model could not be loaded: {failures[0]}")
        info = context.client.model
        window.composer.set_text(MESSAGE)
        window.composer.submit()
        if not window.session.busy:
            raise SelfTestFailed("the message was not sent")
        if not _wait_until(lambda: not window.session.busy, REPLY_TIMEOUT_S):
            raise SelfTestFailed(f"no reply within {REPLY_TIMEOUT_S} s")
        conversation_id = window.session.conversation_id
        reply = context.store.thread(conversation_id)[-1].message
        if reply.state != DONE or not reply.content.strip():
            raise SelfTestFailed(f"the reply ended {reply.state} with {len(reply.content)} characters: {reply.error}")
        exported = folder / "self-test.md"
        write_export(exported, load_transcripts(context.store, [conversation_id]), "md")
        text = exported.read_text(encoding="utf-8")
        if MESSAGE not in text or reply.content.strip() not in text:
            raise SelfTestFailed("the Markdown export lacks the message or the reply")
        stats = reply.stats
        speed, _hit_rate = generating(stats)
        return (
            f"{info.name} on {info.device}: {stats['tokens']} tokens at {speed:.1f} tok/s, "
            f"first token after {stats['time_to_first_token']:.2f} s, "
            f"longest GUI stall {stats['gui_stall_ms']:.0f} ms, export checked"
        )
    finally:
        window.close()
        # The temporary folder goes next; an open database would keep it on Windows.
        context.database.connection.close()


def _show_only_qt_errors() -> Callable | None:
    """The offscreen platform warns about window features it lacks; only errors matter here.
    Returns the handler this one replaces."""
    def handler(kind: QtMsgType, _context: object, text: str) -> None:
        if kind in (QtMsgType.QtCriticalMsg, QtMsgType.QtFatalMsg):
            print(text, file=sys.stderr)

    return qInstallMessageHandler(handler)


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Run the event loop until ``condition`` holds or the time is up."""
    deadline = time.monotonic() + timeout_s
    loop = QEventLoop()
    timer = QTimer()
    timer.timeout.connect(lambda: (condition() or time.monotonic() > deadline) and loop.quit())
    timer.start(20)
    loop.exec()
    timer.stop()
    return condition()
