"""The chat database, without Qt: schema, recovery, conversations, versions, search."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

import seqmoe_chat.store.database
from seqmoe_chat.store import ConversationStore, DatabaseUnavailable, SamplingSettings, open_database
from seqmoe_chat.store.migrations import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from seqmoe_chat.store.records import ASSISTANT, DONE, INTERRUPTED, STREAMING, USER


@pytest.fixture
def store(tmp_path: Path) -> ConversationStore:
    return ConversationStore(open_database(tmp_path / "chats.sqlite3").connection)


def test_a_new_database_uses_wal_and_has_the_current_schema(tmp_path: Path) -> None:
    opened = open_database(tmp_path / "chats.sqlite3")
    assert opened.notice is None
    assert opened.connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert schema_version(opened.connection) == SCHEMA_VERSION == len(MIGRATIONS)
    opened.connection.close()
    reopened = open_database(tmp_path / "chats.sqlite3")
    assert reopened.notice is None and schema_version(reopened.connection) == SCHEMA_VERSION


def test_migrations_apply_only_the_missing_steps(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "m.sqlite3", isolation_level=None)
    steps = [("CREATE TABLE a (x)",), ("CREATE TABLE b (y)", "INSERT INTO b VALUES (1)")]
    migrate(connection, steps[:1])
    assert schema_version(connection) == 1
    migrate(connection, steps)
    migrate(connection, steps)
    assert schema_version(connection) == 2
    assert connection.execute("SELECT COUNT(*) FROM b").fetchone()[0] == 1


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "m.sqlite3", isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        migrate(connection, [("CREATE TABLE a (x)", "NOT SQL")])
    assert schema_version(connection) == 0
    assert connection.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_a_corrupt_database_is_moved_aside_and_a_fresh_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"this is not a database, it is a text file " * 200)
    opened = open_database(path)
    assert opened.notice and "could not be opened" in opened.notice
    kept = list(tmp_path.glob("chats.sqlite3.broken-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"this is not a database")
    assert ConversationStore(opened.connection).summaries() == []


def test_a_database_another_program_holds_or_that_is_read_only_is_left_as_it_is_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock passes and a read-only file is sound: moved aside, every chat was gone from the app.
    monkeypatch.setattr(seqmoe_chat.store.database, "BUSY_TIMEOUT_S", 0.1)
    path = tmp_path / "chats.sqlite3"
    opened = open_database(path)
    ConversationStore(opened.connection).create("Keep me")
    opened.connection.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(DatabaseUnavailable, match="is in use by another program"):
        open_database(path)
    holder.close()
    with monkeypatch.context() as read_only:  # what SQLite says of a file it may not write (chmod binds no root)
        refused = sqlite3.OperationalError("attempt to write a readonly database")
        refused.sqlite_errorcode = sqlite3.SQLITE_READONLY
        read_only.setattr(seqmoe_chat.store.database, "_connect", lambda _path: (_ for _ in ()).throw(refused))
        with pytest.raises(DatabaseUnavailable, match="is read-only; make it writable"):
            open_database(path)
    assert not list(tmp_path.glob("chats.sqlite3.broken-*"))
    assert [s.title for s in ConversationStore(open_database(path).connection).summaries()] == ["Keep me"]


def _failure(code: int, reason: str) -> sqlite3.OperationalError:
    """What SQLite raises for ``code`` (chmod and full disks bind no root, so they are told)."""
    error = sqlite3.OperationalError(reason)
    error.sqlite_errorcode = code
    return error


@pytest.mark.parametrize(("code", "reason"), [
    (sqlite3.SQLITE_FULL, "database or disk is full"),
    (sqlite3.SQLITE_CANTOPEN, "unable to open database file"),
    (sqlite3.SQLITE_IOERR, "disk I/O error"),
])
def test_a_sound_database_on_a_full_disk_or_out_of_reach_is_left_as_it_is_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    # Moved aside, it was replaced by an empty one that the next start opened without a word.
    path = tmp_path / "chats.sqlite3"
    opened = open_database(path)
    ConversationStore(opened.connection).create("Keep me")
    opened.connection.close()
    with monkeypatch.context() as failing:
        failing.setattr(seqmoe_chat.store.database, "_connect", lambda _path: (_ for _ in ()).throw(_failure(code, reason)))
        with pytest.raises(DatabaseUnavailable, match=rf"could not be opened \({reason}\); it was left as it is"):
            open_database(path)
    assert not list(tmp_path.glob("chats.sqlite3.broken-*"))
    assert [s.title for s in ConversationStore(open_database(path).connection).summaries()] == ["Keep me"]


def test_a_broken_database_whose_new_one_cannot_be_made_is_put_back_to_be_found_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"this is not a database, it is a text file " * 200)
    real = seqmoe_chat.store.database._connect
    attempts: list[Path] = []

    def connect(at: Path) -> sqlite3.Connection:
        attempts.append(at)
        if len(attempts) == 1:
            return real(at)  # the broken file: refused as no database
        at.write_bytes(b"")  # the new one is begun, and the disk fills up
        raise _failure(sqlite3.SQLITE_FULL, "database or disk is full")

    monkeypatch.setattr(seqmoe_chat.store.database, "_connect", connect)
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        open_database(path)
    assert path.read_bytes().startswith(b"this is not a database") and not list(tmp_path.glob("chats.sqlite3.broken-*"))
    monkeypatch.undo()
    opened = open_database(path)  # space freed: the next start moves it aside and says so
    assert opened.notice and "could not be opened" in opened.notice
    assert list(tmp_path.glob("chats.sqlite3.broken-*"))

def test_a_database_of_another_app_is_moved_aside_and_a_fresh_one_starts(tmp_path: Path) -> None:
    # Its schema failed the migration: left as it was, it stopped every start, with advice about disk space.
    path = tmp_path / "chats.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE conversations (x)")
        other.commit()
    opened = open_database(path)
    assert opened.notice and "could not be opened" in opened.notice
    assert ConversationStore(opened.connection).summaries() == [] and list(tmp_path.glob("chats.sqlite3.broken-*"))

def _future_table(connection: sqlite3.Connection) -> None:
    """A table in SQL that this SQLite cannot parse, as a newer app's SQLite may write."""
    connection.execute("PRAGMA writable_schema = ON")
    connection.execute("INSERT INTO sqlite_master VALUES "
                       "('table', 'future', 'future', 0, 'CREATE TABLE future (a) WITH FUTURE')")
    connection.execute("PRAGMA writable_schema = OFF")


@pytest.mark.parametrize("future_sql", [False, True], ids=["tables it reads", "tables it cannot parse"])
def test_a_database_from_a_newer_app_is_left_as_it_is_and_said(tmp_path: Path, future_sql: bool) -> None:
    # Moved aside as broken, a new empty one stood in its place, and the newer app, started
    # again, opened that one: every chat seemed gone.
    path = tmp_path / "chats.sqlite3"
    opened = open_database(path)
    ConversationStore(opened.connection).create("Keep me")
    if future_sql:
        _future_table(opened.connection)
    opened.connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    opened.connection.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseUnavailable) as refused:
        open_database(path)
    assert str(refused.value) == (
        f"The chat database {path} was written by a newer SeqMoE Chat (schema {SCHEMA_VERSION + 1}; this version "
        f"reads up to {SCHEMA_VERSION}); it was left as it is. Update SeqMoE Chat, or choose another data folder "
        "with --data-dir or SEQMOE_CHAT_DATA_DIR."
    )
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["chats.sqlite3"]


def test_messages_form_a_thread_and_conversation_settings_are_kept(store: ConversationStore) -> None:
    sampling = SamplingSettings(temperature=0.3, top_p=0.8, max_new_tokens=64, seed=7)
    conversation = store.create(system_prompt="Be brief.", sampling=sampling)
    question = store.add_message(conversation.id, None, USER, "Hi", DONE)
    reply = store.add_message(conversation.id, question.id, ASSISTANT, "", STREAMING)
    store.update_message(reply.id, content="Hello!", state=DONE, stats={"tokens": 3}, model_id="tiny")
    loaded = store.get(conversation.id)
    assert loaded.system_prompt == "Be brief." and loaded.sampling == sampling and loaded.model_id == "tiny"
    thread = store.thread(conversation.id)
    assert [(e.message.role, e.message.content, e.message.state) for e in thread] == [
        (USER, "Hi", DONE),
        (ASSISTANT, "Hello!", DONE),
    ]
    assert thread[1].message.stats == {"tokens": 3}


def test_an_edited_message_keeps_the_earlier_version_and_its_replies(store: ConversationStore) -> None:
    conversation = store.create()
    first = store.add_message(conversation.id, None, USER, "What is 2+2?", DONE)
    old_reply = store.add_message(conversation.id, first.id, ASSISTANT, "5", DONE)
    edited = store.add_message(conversation.id, None, USER, "What is 2+3?", DONE)
    store.add_message(conversation.id, edited.id, ASSISTANT, "5", DONE)
    thread = store.thread(conversation.id)
    assert [e.message.content for e in thread] == ["What is 2+3?", "5"]
    assert (thread[0].version, thread[0].versions) == (2, 2)
    store.select_version(first.id)
    thread = store.thread(conversation.id)
    assert [e.message.id for e in thread] == [first.id, old_reply.id]
    assert (thread[0].version, thread[0].versions) == (1, 2)


def test_search_finds_titles_and_message_text_and_ignores_like_wildcards(store: ConversationStore) -> None:
    cooking = store.create(title="Cooking")
    store.add_message(cooking.id, None, USER, "How long do I boil an egg? About 100% sure it's 7 minutes.", DONE)
    travel = store.create(title="Trip to Lisbon")
    assert {s.id for s in store.summaries("lisbon")} == {travel.id}
    found = store.summaries("boil")
    assert [s.id for s in found] == [cooking.id] and "boil" in found[0].snippet
    assert [s.id for s in store.summaries("100%")] == [cooking.id]
    assert store.summaries("_") == []
    # Case is ignored in every script, not only in ASCII letters.
    other = store.create(title="Unicode")
    store.add_message(other.id, None, USER, "Привет, Ünïcode Straße", DONE)
    for query in ("привет", "ÜNÏCODE", "STRASSE", "ünïcode"):
        assert [s.id for s in store.summaries(query)] == [other.id], query
    assert [s.id for s in store.summaries("КОНВЕРТ")] == []
    # A message that fits the snippet shows whole, its match near the end or not.
    assert store.summaries("minutes")[0].snippet == "How long do I boil an egg? About 100% sure it's 7 minutes."
    long = store.create(title="Long")
    store.add_message(long.id, None, USER, "word " * 40 + "needle " + "word " * 40, DONE)
    snippet = store.summaries("needle")[0].snippet
    assert snippet.startswith("…") and snippet.endswith("…") and "needle" in snippet


def test_deleting_can_be_undone_until_purged(store: ConversationStore) -> None:
    conversation = store.create(title="Keep me")
    store.add_message(conversation.id, None, USER, "hello", DONE)
    store.delete(conversation.id)
    assert store.summaries() == [] and not store.exists(conversation.id)
    store.restore(conversation.id)
    assert [s.title for s in store.summaries()] == ["Keep me"]
    store.delete(conversation.id)
    assert store.purge_deleted() == 1
    assert store.connection.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_replies_streaming_when_the_app_ended_are_marked_interrupted(store: ConversationStore) -> None:
    conversation = store.create()
    question = store.add_message(conversation.id, None, USER, "Tell me a story", DONE)
    store.add_message(conversation.id, question.id, ASSISTANT, "Once upon", STREAMING)
    assert store.mark_interrupted() == 1
    assert store.thread(conversation.id)[1].message.state == INTERRUPTED

