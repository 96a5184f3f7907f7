"""The headless commands: list, export (one or all, every format) and import."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import seqmoe_chat.store.database
from seqmoe_chat.main import main
from seqmoe_chat.store import ConversationStore, open_database
from seqmoe_chat.store.records import ASSISTANT, DONE, USER


@pytest.fixture
def store(data_dir: Path) -> ConversationStore:
    """The database the commands find through $SEQMOE_CHAT_DATA_DIR (set for every test)."""
    store = ConversationStore(open_database(data_dir / "chats.sqlite3").connection)
    for title in ("Birds", "Trees"):
        conversation = store.create(title=title, system_prompt=f"Talk about {title.lower()}.")
        question = store.add_message(conversation.id, None, USER, f"Tell me about {title.lower()}", DONE)
        store.add_message(conversation.id, question.id, ASSISTANT, f"{title} are lovely.", DONE)
    return store


def test_list_prints_ids_and_titles(store: ConversationStore, capsys) -> None:
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{s.id}\t{s.title}" for s in store.summaries()]


def test_a_database_the_app_holds_locked_is_said_in_one_line_and_left_alone(
    store: ConversationStore, data_dir: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(seqmoe_chat.store.database, "BUSY_TIMEOUT_S", 0.1)
    holder = sqlite3.connect(data_dir / "chats.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    assert main(["list"]) == 1
    holder.close()
    assert capsys.readouterr().err.startswith("seqmoe-chat: The chat database") and not list(data_dir.glob("*.broken-*"))
    assert main(["list"]) == 0 and len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize("fmt", ["md", "json", "html", "txt"])
def test_export_one_conversation_in_every_format(store: ConversationStore, tmp_path: Path, fmt: str) -> None:
    birds = next(s.id for s in store.summaries() if s.title == "Birds")
    out = tmp_path / f"birds.{fmt}"
    assert main(["export", "--conversation", str(birds), "--format", fmt, "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "Birds are lovely." in text and "Trees" not in text


def test_export_all_then_import_recreates_everything(store: ConversationStore, tmp_path: Path, capsys) -> None:
    out = tmp_path / "all.json"
    assert main(["export", "--all", "--format", "json", "--out", str(out)]) == 0
    assert [c["title"] for c in json.loads(out.read_text())["conversations"]] == [s.title for s in store.summaries()]
    assert main(["import", str(out)]) == 0
    assert "imported 2 conversation(s)" in capsys.readouterr().err
    assert sorted(s.title for s in store.summaries()) == ["Birds", "Birds", "Trees", "Trees"]


def test_a_transcript_saved_with_a_byte_order_mark_imports(store: ConversationStore, tmp_path: Path, capsys) -> None:
    # As Windows' Notepad saved UTF-8: it was refused as no JSON.
    out = tmp_path / "all.json"
    assert main(["export", "--all", "--format", "json", "--out", str(out)]) == 0
    out.write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
    assert main(["import", str(out)]) == 0 and "imported 2 conversation(s)" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_transcript_in_utf16_or_utf32_with_a_byte_order_mark_imports(
        store: ConversationStore, tmp_path: Path, capsys, encoding: str) -> None:
    # Windows' Notepad saves "Unicode" as UTF-16 with a mark: it ended in the codec's own error.
    out = tmp_path / "all.json"
    assert main(["export", "--all", "--format", "json", "--out", str(out)]) == 0
    out.write_bytes(("\ufeff" + out.read_text(encoding="utf-8")).encode(encoding))
    assert main(["import", str(out)]) == 0 and "imported 2 conversation(s)" in capsys.readouterr().err
    assert sorted(s.title for s in store.summaries()) == ["Birds", "Birds", "Trees", "Trees"]


@pytest.mark.parametrize(("content", "encoding"), [
    ('{"format": "seqmoe-chat-transcript", "title": "Café"}'.encode("latin-1"), "UTF-8"),
    ("\ufeff\ud800{}".encode("utf-16-le", "surrogatepass"), "UTF-16"),
], ids=["latin-1", "broken utf-16"])
def test_a_file_in_another_encoding_is_said_to_be_no_text_file(
        store: ConversationStore, tmp_path: Path, capsys, content: bytes, encoding: str) -> None:
    (tmp_path / "bad.json").write_bytes(content)
    assert main(["import", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err == (f"seqmoe-chat: {tmp_path / 'bad.json'} cannot be imported: "
                                       f"not a {encoding} text file, so not a SeqMoE Chat transcript\n")


def test_an_import_the_disk_refuses_half_way_imports_nothing(
    store: ConversationStore, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "all.json"
    assert main(["export", "--all", "--format", "json", "--out", str(out)]) == 0
    insert = ConversationStore._insert_transcript
    calls = []

    def second_fails(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        return insert(self, *args)

    monkeypatch.setattr(ConversationStore, "_insert_transcript", second_fails)
    assert main(["import", str(out)]) == 1
    assert "disk is full" in capsys.readouterr().err
    assert sorted(s.title for s in store.summaries()) == ["Birds", "Trees"]


def test_commands_fail_clearly(store: ConversationStore, tmp_path: Path, capsys) -> None:
    assert main(["export", "--conversation", "999", "--format", "md", "--out", str(tmp_path / "x.md")]) == 2
    assert "there is no conversation 999" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[]", encoding="utf-8")
    assert main(["import", str(tmp_path / "bad.json")]) == 2
    assert "cannot be imported" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing.json")]) == 1
    assert main(["export", "--all", "--format", "md", "--out", str(tmp_path / "no-folder" / "x.md")]) == 1


@pytest.mark.parametrize("content", [
    '{"format": "seqmoe-chat-transcript", "version": 1, "conversations": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"format": "seqmoe-chat-transcript", "version": 1, "conversations": [{"title": "x", "sampling": null, "messages": []}]}',
    '{"format": "seqmoe-chat-transcript", "version": 1, "conversations": [{"title": "x", "messages": [{"id": 1,'
    ' "role": "user", "content": "\\ud800", "created_at": "2025-01-01"}], "created_at": "2025-01-01", "updated_at": "2025-01-01"}]}',
], ids=["nested too deeply", "null sampling", "lone surrogate"])
def test_a_malformed_import_is_one_line_and_imports_nothing(
        store: ConversationStore, tmp_path: Path, capsys, content: str) -> None:
    (tmp_path / "bad.json").write_text(content, encoding="utf-8")
    assert main(["import", str(tmp_path / "bad.json")]) == 2
    error = capsys.readouterr().err
    assert "cannot be imported" in error and error.count("\n") == 1
    assert sorted(s.title for s in store.summaries()) == ["Birds", "Trees"]
