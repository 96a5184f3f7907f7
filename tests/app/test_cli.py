"""The headless commands: list, export (one or all, every format) and import."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

import seqmoe_chat.store.database
from seqmoe_chat.main import main
from seqmoe_chat.store import ConversationStore, open_database
from seqmoe_chat.store.migrations import SCHEMA_VERSION
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


def test_list_prints_each_title_on_one_line_with_control_characters_escaped(data_dir: Path, capsys) -> None:
    # A line break or a tab made a fake row; a direction override reordered what the terminal showed.
    store = ConversationStore(open_database(data_dir / "chats.sqlite3").connection)
    titles = {
        "Two\nlines": "Two\\nlines",
        "tab\there\r": "tab\\there\\r",
        "\u202eevil.exe\u2066x\u2069": "\\u202eevil.exe\\u2066x\\u2069",
        "\x1b[31mred\u2028para": "\\x1b[31mred\\u2028para",
        "C:\\new": "C:\\\\new",
        "Café 日本語 👍": "Café 日本語 👍",
    }
    ids = {store.create(title=title).id: shown for title, shown in titles.items()}
    assert main(["list"]) == 0
    assert sorted(capsys.readouterr().out.split("\n")) == sorted(["", *(f"{i}\t{shown}" for i, shown in ids.items())])


def test_commands_on_a_database_a_newer_version_wrote_say_so_in_one_line_and_leave_it_alone(
    store: ConversationStore, data_dir: Path, tmp_path: Path, capsys
) -> None:
    # `list` moved it aside, made an empty one and printed an empty list with exit 0.
    store.connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store.connection.close()
    before = (data_dir / "chats.sqlite3").read_bytes()
    for command in (["list"], ["export", "--all", "--format", "md", "--out", str(tmp_path / "all.md")]):
        assert main(command) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err.startswith(f"seqmoe-chat: The chat database {data_dir / 'chats.sqlite3'} was written by "
                                       f"a newer SeqMoE Chat (schema {SCHEMA_VERSION + 1}; this version reads up to "
                                       f"{SCHEMA_VERSION})")
    assert (data_dir / "chats.sqlite3").read_bytes() == before and not list(data_dir.glob("*.broken-*"))
    assert not (tmp_path / "all.md").exists()


def test_export_with_nothing_to_export_writes_nothing(data_dir: Path, tmp_path: Path, capsys) -> None:
    # It wrote an empty file over an earlier export, with exit 0.
    open_database(data_dir / "chats.sqlite3").connection.close()
    earlier = tmp_path / "all.json"
    earlier.write_text("the earlier export")
    assert main(["export", "--all", "--format", "json", "--out", str(earlier), "--force"]) == 2
    assert main(["export", "--all", "--format", "json", "--out", str(tmp_path / "new.json")]) == 2
    assert capsys.readouterr().err.count("there are no conversations to export; nothing was written") == 2
    assert earlier.read_text() == "the earlier export" and not (tmp_path / "new.json").exists()


def test_export_replaces_a_file_only_with_force(store: ConversationStore, tmp_path: Path, capsys) -> None:
    out = tmp_path / "all.md"
    out.write_text("mine")
    out.chmod(0o444)
    assert main(["export", "--all", "--format", "md", "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"seqmoe-chat: {out} exists; add --force to replace it\n"
    assert out.read_text() == "mine"
    assert main(["export", "--all", "--format", "md", "--out", str(out), "--force"]) == 0
    assert "Birds are lovely." in out.read_text()


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_export_never_replaces_the_chat_database(
    store: ConversationStore, data_dir: Path, tmp_path: Path, capsys, suffix: str
) -> None:
    # `--out DATA/chats.sqlite3` replaced every chat with a Markdown file.
    spellings = [data_dir / f"chats.sqlite3{suffix}", tmp_path / "data" / ".." / "data" / f"chats.sqlite3{suffix}"]
    if suffix == "":
        os.link(data_dir / "chats.sqlite3", tmp_path / "hard-link")
        spellings.append(tmp_path / "hard-link")
    for out in spellings:
        assert main(["export", "--all", "--format", "md", "--out", str(out), "--force"]) == 1
        assert capsys.readouterr().err == f"seqmoe-chat: {out} is a file of the chat database; choose another name\n"
    assert main(["list"]) == 0 and len(capsys.readouterr().out.splitlines()) == 2


def test_export_never_replaces_a_link_a_folder_or_a_pipe(store: ConversationStore, tmp_path: Path, capsys) -> None:
    # Each was replaced by a plain file (a folder failed with the rename's own error).
    target = tmp_path / "target.md"
    target.write_text("mine")
    (tmp_path / "link.md").symlink_to(target)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    expected = {
        "link.md": "is a symbolic link; give the file it points to, or another name",
        "folder": "is a folder, not a file; choose another name",
        "pipe": "is a named pipe, not a file; choose another name",
    }
    for name, why in expected.items():
        assert main(["export", "--all", "--format", "md", "--out", str(tmp_path / name), "--force"]) == 1
        assert capsys.readouterr().err == f"seqmoe-chat: {tmp_path / name} {why}\n"
    assert (tmp_path / "link.md").is_symlink() and target.read_text() == "mine"
    assert stat.S_ISFIFO((tmp_path / "pipe").lstat().st_mode) and (tmp_path / "folder").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "folder", "link.md", "pipe", "target.md"]


def test_an_empty_out_name_is_refused_plainly(store: ConversationStore, capsys) -> None:
    # Path("") is the current folder: "cannot write .: Device or resource busy".
    with pytest.raises(SystemExit) as ended:
        main(["export", "--all", "--format", "md", "--out", ""])
    assert ended.value.code == 2 and "argument --out: an empty file name" in capsys.readouterr().err


def test_an_empty_data_folder_name_is_refused_not_taken_as_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # A launcher's --data-dir "$UNSET" put the chat database in whatever folder it started in.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(["--data-dir", "", "list"])
    assert ended.value.code == 2 and "argument --data-dir: an empty folder name" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_conversation_id_past_sqlites_integers_is_no_conversation(store: ConversationStore, tmp_path: Path,
                                                                     capsys) -> None:
    # SQLite's OverflowError ended the command with a traceback.
    for number in ("99999999999999999999999", "-99999999999999999999999"):
        assert main(["export", "--conversation", number, "--format", "md", "--out", str(tmp_path / "x.md")]) == 2
        assert f"there is no conversation {number}" in capsys.readouterr().err


def test_a_data_folder_that_cannot_be_made_is_said_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    # mkdir's FileExistsError, NotADirectoryError or PermissionError ended the command with a traceback.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for folder, reason in ((blocker, "it is not a folder"), (blocker / "data", "Not a directory")):
        assert main(["--data-dir", str(folder), "list"]) == 1
        assert capsys.readouterr().err == (f"seqmoe-chat: the data folder {folder} cannot be used: {reason}; "
                                           "choose another with --data-dir or SEQMOE_CHAT_DATA_DIR\n")
    with monkeypatch.context() as refusing:  # chmod binds no root
        refusing.setattr(Path, "mkdir", lambda *args, **kwargs: (_ for _ in ()).throw(
            PermissionError(13, "Permission denied")))
        assert main(["--data-dir", str(tmp_path / "locked" / "data"), "list"]) == 1
    assert capsys.readouterr().err.endswith("cannot be used: Permission denied; choose another with --data-dir "
                                            "or SEQMOE_CHAT_DATA_DIR\n")


def test_importing_a_file_with_no_conversations_says_so(store: ConversationStore, tmp_path: Path, capsys) -> None:
    # It said "imported 0 conversation(s): ", a list left hanging.
    empty = tmp_path / "empty.json"
    empty.write_text('{"format": "seqmoe-chat-transcript", "version": 1, "conversations": []}', encoding="utf-8")
    assert main(["import", str(empty)]) == 0
    assert capsys.readouterr().err == f"imported nothing: {empty} holds no conversations\n"
