"""A chat database damaged or edited by another program (it still passes SQLite's own checks):
every chat opens, with what can be shown, and exports and imports again."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqmoe_chat.store import ConversationStore, SamplingSettings, open_database
from seqmoe_chat.store.records import ASSISTANT, DONE, USER
from seqmoe_chat.transcripts.export import FORMAT_NAMES, render
from seqmoe_chat.transcripts.json_format import from_json
from seqmoe_chat.transcripts.transcript import load_transcripts

from .fakes import reply_for
from .test_chat import send, shown, wait_idle
from .waits import model_shown

HELLO_REPLY = reply_for([{"role": "user", "content": "Hello"}])


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fails what would hang instead (a loop without end, its memory growing), so the suite goes on."""
    def expire(_signal: int, _frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def reopened_after(qtbot, make_window, data_dir: Path, sql: str):
    """The window at the next start, after ``sql`` changed the chat "Hello" on disk; ``sql``
    may name the user's message ``:user`` and the reply ``:reply``."""
    window = make_window()
    send(qtbot, window, "Hello")
    wait_idle(qtbot, window)
    user, reply = (widget.message.id for widget in window.chat.widgets.values())
    window.close()
    with contextlib.closing(sqlite3.connect(data_dir / "chats.sqlite3")) as connection:
        connection.execute(sql, {"user": user, "reply": reply})
        connection.commit()
    with deadline(5):
        window = make_window(wait_for_model=False)
    qtbot.waitUntil(lambda: model_shown(window), timeout=10_000)
    return window


def test_a_loop_of_parents_is_cut_and_the_chat_opens_with_its_messages(qtbot, make_window, data_dir: Path) -> None:
    window = reopened_after(qtbot, make_window, data_dir, "UPDATE messages SET parent_id = :reply WHERE id = :user")
    assert shown(window) == [(USER, "Hello"), (ASSISTANT, HELLO_REPLY)]
    send(qtbot, window, "Still there?")
    wait_idle(qtbot, window)
    assert shown(window)[2:] == [(USER, "Still there?"), (ASSISTANT, reply_for([{"role": "user", "content": "Still there?"}]))]


def test_showing_a_version_inside_a_loop_of_parents_ends(tmp_path: Path) -> None:
    store = ConversationStore(open_database(tmp_path / "chats.sqlite3").connection)
    conversation = store.create()
    first = store.add_message(conversation.id, None, USER, "Hi", DONE)
    store.add_message(conversation.id, first.id, ASSISTANT, "Hello", DONE)
    again = store.add_message(conversation.id, first.id, ASSISTANT, "Hello again", DONE)
    store.connection.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (again.id, first.id))
    with deadline(5):
        store.select_version(again.id)
        thread = store.thread(conversation.id)
    assert sorted(entry.message.content for entry in thread) == ["Hello again", "Hi"]


@pytest.mark.parametrize("sampling", ["'not json'", "'[1, 2]'", "'null'"])
def test_sampling_that_is_no_json_object_keeps_the_defaults_and_the_chat_opens(
        qtbot, make_window, data_dir: Path, sampling: str) -> None:
    window = reopened_after(qtbot, make_window, data_dir, f"UPDATE conversations SET sampling = {sampling}")
    assert shown(window) == [(USER, "Hello"), (ASSISTANT, HELLO_REPLY)]
    assert window.store.get(window.session.conversation_id).sampling == SamplingSettings()


@pytest.mark.parametrize("stats", ['{"tokens": "many"}', '{"hit_rate": null}', '{"tokens": 3, "policy": [1]}', "null"])
def test_statistics_that_are_no_figures_show_no_line_and_the_reply_stays(
        qtbot, make_window, data_dir: Path, stats: str) -> None:
    window = reopened_after(qtbot, make_window, data_dir, f"UPDATE messages SET stats = '{stats}' WHERE id = :reply")
    assert shown(window) == [(USER, "Hello"), (ASSISTANT, HELLO_REPLY)]
    reply = list(window.chat.widgets.values())[1]
    assert reply.message.state == DONE and reply.message.model_id and reply.note.text() == ""
    exported = render(load_transcripts(window.store, [window.session.conversation_id]), "json")
    assert [message.content for message in from_json(exported)[0].messages] == ["Hello", HELLO_REPLY]


def test_text_stored_as_bytes_is_shown_as_text(qtbot, make_window, data_dir: Path) -> None:
    # "Hellö" in UTF-8, then a byte that is no UTF-8.
    window = reopened_after(qtbot, make_window, data_dir, "UPDATE messages SET content = x'48656c6cc3b6ff' WHERE id = :user")
    assert shown(window) == [(USER, "Hellö\N{REPLACEMENT CHARACTER}"), (ASSISTANT, HELLO_REPLY)]
    assert "Hellö" in render(load_transcripts(window.store, [window.session.conversation_id]), "md")


@pytest.mark.parametrize("sql", [
    "UPDATE conversations SET title = x'48656c6c6f'",  # b"Hello": the list lost every chat
    "UPDATE conversations SET system_prompt = x'4265206b696e64'",  # the header raised
    "UPDATE messages SET model_id = x'74696e79', error = x'6f6f7073' WHERE id = :reply",
], ids=["title", "system-prompt", "model-and-error"])
def test_a_field_stored_as_bytes_is_shown_as_text_and_the_chat_exports_and_imports(
        qtbot, make_window, data_dir: Path, sql: str) -> None:
    window = reopened_after(qtbot, make_window, data_dir, sql)
    conversation = window.store.get(window.session.conversation_id)
    assert window.sidebar.list.count() == 1 and window.sidebar.list.item(0).text() == conversation.title
    assert shown(window) == [(USER, "Hello"), (ASSISTANT, HELLO_REPLY)]
    transcripts = load_transcripts(window.store, [conversation.id])
    for fmt in FORMAT_NAMES:
        assert "Hello" in render(transcripts, fmt)
    assert [message.content for message in from_json(render(transcripts, "json"))[0].messages] == ["Hello", HELLO_REPLY]


def test_a_message_time_that_is_no_time_is_exported_as_it_is(qtbot, make_window, data_dir: Path) -> None:
    # Every export raised on it. Importing it back is refused, with the reason, as any such file is.
    window = reopened_after(qtbot, make_window, data_dir, "UPDATE messages SET created_at = 'yesterday' WHERE id = :user")
    assert shown(window) == [(USER, "Hello"), (ASSISTANT, HELLO_REPLY)]
    transcripts = load_transcripts(window.store, [window.session.conversation_id])
    assert all("Hello" in render(transcripts, fmt) for fmt in FORMAT_NAMES)
    assert "yesterday" in render(transcripts, "md")
