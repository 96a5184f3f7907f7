"""The command line: options of the app, and the headless export, import and list commands.

The headless commands touch only the chat database: they start no Qt and load no model.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from .app_metadata import app_version
from .paths import data_dir
from .store import DATABASE_NAME, ConversationStore, DatabaseUnavailable, open_database
from .transcripts.export import FORMAT_NAMES, write_export
from .transcripts.json_format import TranscriptError, read_json
from .transcripts.transcript import load_transcripts, store_transcripts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqmoe-chat", description="SeqMoE Chat: chat with local MoE models.")
    parser.add_argument("--data-dir", type=Path, help="folder of the chat database (default: the user data folder)")
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
    export.add_argument("--out", type=Path, required=True, help="the file to write")
    imported = commands.add_parser("import", help="add the conversations of a JSON transcript")
    imported.add_argument("file", type=Path)
    commands.add_parser("list", help="print each conversation's id and title")
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run ``export``, ``import`` or ``list``; messages for people go to stderr."""
    try:
        opened = open_database(data_dir(args.data_dir) / DATABASE_NAME)
    except DatabaseUnavailable as error:
        print(f"seqmoe-chat: {error}", file=sys.stderr)
        return 1
    if opened.notice:
        print(opened.notice, file=sys.stderr)
    store = ConversationStore(opened.connection)
    try:
        if args.command == "list":
            for summary in store.summaries():
                print(f"{summary.id}\t{summary.title}")
            return 0
        if args.command == "import":
            return _import(store, args.file)
        return _export(store, args)
    finally:
        opened.connection.close()


def _export(store: ConversationStore, args: argparse.Namespace) -> int:
    if args.all:
        ids = [summary.id for summary in store.summaries()]
    elif store.exists(args.conversation):
        ids = [args.conversation]
    else:
        print(f"seqmoe-chat: there is no conversation {args.conversation} (see `seqmoe-chat list`)", file=sys.stderr)
        return 2
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
    print(f"imported {len(ids)} conversation(s): {', '.join(map(str, ids))}", file=sys.stderr)
    return 0


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)
