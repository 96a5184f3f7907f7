"""The schema of the chat database, as a list of migrations.

``PRAGMA user_version`` holds how many migrations a database has had. A new version of
the schema is a new entry at the end of ``MIGRATIONS``; existing entries never change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .transactions import transaction

Migration = Sequence[str]

_SCHEMA_1: Migration = (
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        sampling TEXT NOT NULL,
        model_id TEXT NOT NULL DEFAULT '',
        current_leaf_id INTEGER,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        deleted_at TEXT
    )""",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        state TEXT NOT NULL,
        error TEXT NOT NULL DEFAULT '',
        model_id TEXT NOT NULL DEFAULT '',
        stats TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX messages_by_conversation ON messages(conversation_id, id)",
    "CREATE INDEX messages_by_parent ON messages(parent_id)",
    "CREATE INDEX conversations_by_update ON conversations(updated_at)",
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)

MIGRATIONS: tuple[Migration, ...] = (_SCHEMA_1,)
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(sqlite3.DatabaseError):
    """The database was written by a newer version of the app."""

    def __init__(self, version: int, readable: int) -> None:
        super().__init__(f"its schema version {version} is newer than this app's {readable}")
        self.version = version
        self.readable = readable


def schema_version(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA user_version").fetchone()[0])


def refuse_newer(connection: sqlite3.Connection, readable: int = SCHEMA_VERSION) -> int:
    """The database's schema version; ``SchemaTooNew`` when it is above ``readable``. Reading it
    needs only the file's header: a newer app's tables may use SQL this SQLite cannot parse."""
    version = schema_version(connection)
    if version > readable:
        raise SchemaTooNew(version, readable)
    return version


def migrate(connection: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> None:
    """Apply the migrations this database has not had yet, each in its own transaction."""
    version = refuse_newer(connection, len(migrations))
    for number in range(version, len(migrations)):
        with transaction(connection):
            for statement in migrations[number]:
                connection.execute(statement)
            # user_version lives in the file header and commits with the transaction.
            connection.execute(f"PRAGMA user_version = {number + 1}")
