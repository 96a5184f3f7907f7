"""Opening the chat database: WAL mode, migrations, and recovery from a broken file.

A database that cannot be used (corrupt, written by a newer app) is renamed, never deleted,
and the app starts with a fresh one and tells the user. Any other failure leaves the file where
it is, and the app says why it cannot open it (``DatabaseUnavailable``) instead of starting
without the user's chats: another program holds it locked, it is read-only, the disk is full,
the folder refuses access. Moved aside for those, it was gone from the next start once the
cause was gone (a new, empty database stood in its place, and nothing said where the old one
went).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .migrations import SchemaTooNew, migrate
from .transactions import transaction

DATABASE_NAME = "chats.sqlite3"
BUSY_TIMEOUT_S = 2.0
_COMPANIONS = ("", "-wal", "-shm")


class DatabaseUnavailable(sqlite3.OperationalError):
    """The database is sound but cannot be used now; the message says why and what to do."""


class _FailedIntegrityCheck(sqlite3.DatabaseError):
    pass


_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
"""SQLite's primary codes for a file that is damaged or no database: the only ones moved aside."""


@dataclass
class OpenedDatabase:
    connection: sqlite3.Connection
    path: Path
    notice: str | None = None  # for the user, when the old file had to be moved aside


def open_database(path: Path) -> OpenedDatabase:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return OpenedDatabase(_connect(path), path)
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
        if code not in _DAMAGED and not isinstance(error, (_FailedIntegrityCheck, SchemaTooNew)):
            raise DatabaseUnavailable(
                f"The chat database {path} could not be opened ({error}); it was left as it is. Free some disk "
                "space or give this user access to its folder, and try again, or choose another data folder "
                "with --data-dir or SEQMOE_CHAT_DATA_DIR."
            ) from None
        moved = _move_aside(path)
        notice = (
            f"The chat database could not be opened ({error}). It was kept as {moved} "
            "and SeqMoE Chat started with a new, empty one."
        )
        try:
            return OpenedDatabase(_connect(path), path, notice)
        except BaseException:
            # Put back, so that the next start finds the broken file and says so, instead of the
            # empty one this attempt left, without a word.
            _move_back(moved, path)
            raise


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit: every write outside ``transaction`` is durable at once, which is what
    # "a streaming reply is saved every second" needs.
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
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
            raise _FailedIntegrityCheck(f"integrity check failed: {check}")
        # Taking the write lock once proves nobody else holds it.
        with transaction(connection):
            pass
        migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _move_aside(path: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.broken-{stamp}")
    for suffix in _COMPANIONS:
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, Path(f"{target}{suffix}"))
    return target


def _move_back(moved: Path, path: Path) -> None:
    for suffix in _COMPANIONS:
        Path(f"{path}{suffix}").unlink(missing_ok=True)
        source = Path(f"{moved}{suffix}")
        if source.exists():
            os.replace(source, Path(f"{path}{suffix}"))
