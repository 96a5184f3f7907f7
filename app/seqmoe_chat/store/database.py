"""Opening the chat database: WAL mode, migrations, and recovery from a broken file.

A database that cannot be used (damaged, no database at all, its schema another app's) is
renamed, never deleted, and the app starts with a fresh one and tells the user. A sound one that
the computer keeps out of reach for now is left where it is, and the app says why it cannot open
it (``DatabaseUnavailable``) instead of starting without the user's chats: another program holds
it locked, it is read-only, the disk is full, the folder refuses access, an I/O error. Moved aside
for those, it was gone from the next start once the cause was gone (a new, empty database stood
in its place, and nothing said where the old one went). A database that a newer version of the
app wrote is left as it is too, and said the same way: moved aside, the newer version, started
again, found the empty one in its place and the user's chats seemed gone.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..models.json_file import broken_name
from .migrations import SchemaTooNew, migrate, refuse_newer
from .transactions import transaction

DATABASE_NAME = "chats.sqlite3"
BUSY_TIMEOUT_S = 2.0


class DatabaseUnavailable(sqlite3.OperationalError):
    """The database is sound but cannot be used now; the message says why and what to do."""


_OUT_OF_REACH = (
    sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_NOLFS, sqlite3.SQLITE_AUTH,
)
"""SQLite's primary codes for a sound file the computer keeps out of reach for now: left as it is.
Any other failure (damage, no database, another app's schema) is the file's own."""


@dataclass
class OpenedDatabase:
    connection: sqlite3.Connection
    path: Path
    notice: str | None = None  # for the user, when the old file had to be moved aside


def database_files(path: Path) -> list[Path]:
    """The files of the database at ``path``: itself, its write-ahead log and its shared memory."""
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]


def open_database(path: Path) -> OpenedDatabase:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return OpenedDatabase(_connect(path), path)
    except SchemaTooNew as error:
        raise DatabaseUnavailable(
            f"The chat database {path} was written by a newer SeqMoE Chat (schema {error.version}; this version "
            f"reads up to {error.readable}); it was left as it is. Update SeqMoE Chat, or choose another data "
            "folder with --data-dir or SEQMOE_CHAT_DATA_DIR."
        ) from None
    except sqlite3.DatabaseError as error:
        code = getattr(error, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise DatabaseUnavailable(
                f"The chat database {path} is in use by another program (SeqMoE Chat with the same data folder?); "
                "close it and try again."
            ) from None
        if code == sqlite3.SQLITE_READONLY:
            raise DatabaseUnavailable(
                f"The chat database {path} is read-only; make it writable, or choose another data folder "
                "with --data-dir or SEQMOE_CHAT_DATA_DIR."
            ) from None
        if code in _OUT_OF_REACH:
            raise DatabaseUnavailable(
                f"The chat database {path} could not be opened ({error}); it was left as it is. Free some disk "
                "space or give this user access to its folder, and try again, or choose another data folder "
                "with --data-dir or SEQMOE_CHAT_DATA_DIR."
            ) from None
        moved = broken_name(path)
        _move(path, moved)
        notice = (
            f"The chat database could not be opened ({error}). It was kept as {moved} "
            "and SeqMoE Chat started with a new, empty one."
        )
        try:
            return OpenedDatabase(_connect(path), path, notice)
        except BaseException:
            # Put back, so that the next start finds the broken file and says so, instead of the
            # empty one this attempt left, without a word.
            _move(moved, path)
            raise


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit: every write outside ``transaction`` is durable at once, which is what
    # "a streaming reply is saved every second" needs.
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        # First, before anything is written or the tables are parsed: a newer app's file stays as it is.
        refuse_newer(connection)
        if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
            raise sqlite3.DatabaseError("write-ahead logging is unavailable")
        # NORMAL keeps every commit after an app crash; only a power cut may lose the last ones.
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA foreign_keys=ON")
        # SQLite's LIKE and lower() fold ASCII letters only: search folds every script's case.
        connection.create_function("casefold", 1, lambda text: text.casefold() if isinstance(text, str) else text,
                                   deterministic=True)
        check = connection.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")
        # Taking the write lock once proves nobody else holds it.
        with transaction(connection):
            pass
        migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _move(source: Path, target: Path) -> None:
    """The database at ``source`` and its companion files, to ``target``, over what is there."""
    for moved, replaced in zip(database_files(source), database_files(target)):
        replaced.unlink(missing_ok=True)
        if moved.exists():
            os.replace(moved, replaced)
