"""The command line: options of the app, and the headless export, import and list commands.

The headless commands touch only the chat database: they start no Qt and load no model.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

from .app_metadata import app_version
from .export_destination import refusal
from .paths import data_dir, folder_problem
from .store import DATABASE_NAME, ConversationStore, DatabaseUnavailable, open_database
from .transcripts.export import FORMAT_NAMES, write_export
from .transcripts.json_format import TranscriptError, read_json
from .transcripts.transcript import load_transcripts, store_transcripts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqmoe-chat", description="SeqMoE Chat: chat with local MoE models.")
    parser.add_argument("--data-dir", type=_named("folder"), help="folder of the chat database (default: the user data folder)")
    parser.add_argument("--model", help="model folder or hub id to load at start (default: the bundled demo model)")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="open the window offscreen with a temporary data folder, chat once, export, print one line, exit 0 or 1",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {app_version()}")
    desktop = parser.add_mutually_exclusive_group()
    desktop.add_argument(
        "--install-desktop-entry",
        dest="desktop_entry",
        action="store_const",
        const="install",
        help="add SeqMoE Chat to this Linux user's application menu (a .desktop file and icons)",
    )
    desktop.add_argument(
        "--uninstall-desktop-entry",
        dest="desktop_entry",
        action="store_const",
        const="uninstall",
        help="remove what --install-desktop-entry added",
    )
    commands = parser.add_subparsers(dest="command")
    export = commands.add_parser("export", help="write conversations to a file")
    which = export.add_mutually_exclusive_group(required=True)
    which.add_argument("--conversation", type=int, metavar="ID", help="the conversation's id (see `list`)")
    which.add_argument("--all", action="store_true", help="every conversation, in one file")
    export.add_argument("--format", choices=list(FORMAT_NAMES), required=True)
    export.add_argument("--out", type=_named("file"), required=True, help="the file to write")
    export.add_argument(
        "--force",
        action="store_true",
        help="replace the file at --out if there is one (never a folder, link, pipe, device or the chat database)",
    )
    imported = commands.add_parser("import", help="add the conversations of a JSON transcript")
    imported.add_argument("file", type=Path)
    commands.add_parser(
        "list", help="print each conversation's id and title, one a line (control characters escaped, as \\n)"
    )
    return parser


def _named(kind: str) -> Callable[[str], Path]:
    """An argument type for a path that refuses an empty one: Path("") is ".", the current folder
    (an export then failed with a word about a busy device; the chats went into the current folder)."""

    def path(text: str) -> Path:
        if not text:
            raise argparse.ArgumentTypeError(f"an empty {kind} name")
        return Path(text)

    return path


def run_command(args: argparse.Namespace) -> int:
    """Run ``export``, ``import`` or ``list``; messages for people go to stderr."""
    folder = data_dir(args.data_dir)
    try:
        opened = open_database(folder / DATABASE_NAME)
    except DatabaseUnavailable as error:
        print(f"seqmoe-chat: {error}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as error:  # the folder is a file, is under one, refuses this user, is full
        print(f"seqmoe-chat: the data folder {folder} cannot be used: {folder_problem(error)}; choose another with "
              "--data-dir or SEQMOE_CHAT_DATA_DIR", file=sys.stderr)
        return 1
    if opened.notice:
        print(opened.notice, file=sys.stderr)
    store = ConversationStore(opened.connection)
    try:
        if args.command == "list":
            for summary in store.summaries():
                print(f"{summary.id}\t{_one_line(summary.title)}")
            return 0
        if args.command == "import":
            return _import(store, args.file)
        return _export(store, opened.path, args)
    finally:
        opened.connection.close()


_REORDERING = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}
"""Unicode's explicit direction controls: printed raw, they reorder the rest of a terminal's line."""


def _one_line(text: str) -> str:
    """``text`` on one line, unambiguously: controls (a line break, a tab, a terminal's escape),
    line and paragraph separators, direction controls and the backslash, escaped as in a Python
    string; in a title they made a row look like two, or showed other text than was stored."""
    return "".join(
        repr(character)[1:-1]
        if character == "\\"
        or unicodedata.category(character) in ("Cc", "Zl", "Zp")
        or unicodedata.bidirectional(character) in _REORDERING
        else character
        for character in text
    )


def _export(store: ConversationStore, database: Path, args: argparse.Namespace) -> int:
    if args.all:
        ids = [summary.id for summary in store.summaries()]
    elif store.exists(args.conversation):
        ids = [args.conversation]
    else:
        print(f"seqmoe-chat: there is no conversation {args.conversation} (see `seqmoe-chat list`)", file=sys.stderr)
        return 2
    if not ids:  # an empty file written over an earlier export
        print("seqmoe-chat: there are no conversations to export; nothing was written", file=sys.stderr)
        return 2
    refused = refusal(args.out, database, args.force)
    if refused:
        print(f"seqmoe-chat: {refused}", file=sys.stderr)
        return 1
    try:
        write_export(args.out, load_transcripts(store, ids), args.format)
    except OSError as error:
        print(f"seqmoe-chat: cannot write {args.out}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"exported {len(ids)} conversation(s) to {args.out}", file=sys.stderr)
    return 0


def _import(store: ConversationStore, file: Path) -> int:
    try:
        ids = store_transcripts(store, read_json(file))
    except OSError as error:
        print(f"seqmoe-chat: cannot read {file}: {error.strerror or error}", file=sys.stderr)
        return 1
    except TranscriptError as error:
        print(f"seqmoe-chat: {file} cannot be imported: {error}", file=sys.stderr)
        return 2
    except sqlite3.Error as error:
        print(f"seqmoe-chat: the chat database refused the import ({error}); nothing was imported", file=sys.stderr)
        return 1
    if not ids:
        print(f"imported nothing: {file} holds no conversations", file=sys.stderr)
        return 0
    print(f"imported {len(ids)} conversation(s): {', '.join(map(str, ids))}", file=sys.stderr)
    return 0


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)
