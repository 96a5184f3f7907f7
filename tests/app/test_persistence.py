"""Nothing typed is lost: killing the app mid-reply keeps the message and all but the last
second of the reply, and the next start shows the reply as interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from seqmoe_chat.store import ConversationStore, open_database
from seqmoe_chat.store.records import ASSISTANT, DONE, INTERRUPTED, STREAMING, USER

ROOT = Path(__file__).resolve().parents[2]


def test_killing_the_app_mid_reply_loses_at_most_the_last_second(qtbot, make_window, data_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.app.kill_target", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ},
    )
    shown: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, "the app ended before it was killed"
            shown.append(tuple(float(x) for x in line.split()))
            streaming_since = next((t for t, length in shown if length > 0), None)
            # Kill once the reply has been showing text for a while, so a second before the kill it had some.
            if streaming_since is not None and shown[-1][0] - streaming_since > 1.5:
                break
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
    store = ConversationStore(open_database(data_dir / "chats.sqlite3").connection)
    (summary,) = store.summaries()
    user, reply = (entry.message for entry in store.thread(summary.id))
    assert (user.role, user.content, user.state) == (USER, "Write a very long story", DONE)
    assert reply.role == ASSISTANT and reply.state == STREAMING
    shown_a_second_before = max(length for t, length in shown if t <= killed_at - 1.0)
    assert len(reply.content) >= shown_a_second_before > 0
    store.connection.close()

    window = make_window()
    widgets = list(window.chat.widgets.values())
    assert widgets[1].message.state == INTERRUPTED and "interrupted" in widgets[1].note.text()
    assert widgets[1].body.source_text == reply.content


def test_quitting_while_the_engine_is_inside_a_long_step_ends_the_app_cleanly(data_dir: Path) -> None:
    # Without leave(), Qt aborts the process (SIGABRT) as it destroys the engine's running thread.
    child = subprocess.run(
        [sys.executable, "-m", "tests.app.quit_target", str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ}, timeout=25,
    )
    assert child.returncode == 0, child.stderr
    store = ConversationStore(open_database(data_dir / "chats.sqlite3").connection)
    (conversation,) = store.summaries()
    assert [(e.message.role, e.message.content) for e in store.thread(conversation.id)][0] == (USER, "Are you there?")
