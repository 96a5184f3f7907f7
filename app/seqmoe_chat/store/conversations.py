"""Conversations and their messages in the chat database.

Every write commits at once (the connection is in autocommit mode), so whatever the
app shows as sent or received is on disk when the call returns.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from ..transcripts.reply_stats import NUMBERS
from .records import (
    INTERRUPTED,
    STREAMING,
    Conversation,
    ConversationSummary,
    Message,
    SamplingSettings,
    ThreadEntry,
    is_number,
    now_iso,
)
from .threads import latest_leaf, visible_thread
from .transactions import transaction

DEFAULT_TITLE = "New chat"
SNIPPET_CHARS = 70

_MESSAGE_COLUMNS = (
    "id, conversation_id, parent_id, role, content, created_at, updated_at, state, error, model_id, stats"
)
_CONVERSATION_COLUMNS = "id, title, system_prompt, sampling, model_id, current_leaf_id, created_at, updated_at"


class ConversationStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    # Conversations

    def create(
        self, title: str = DEFAULT_TITLE, system_prompt: str = "", sampling: SamplingSettings | None = None, model_id: str = ""
    ) -> Conversation:
        now = now_iso()
        sampling = sampling or SamplingSettings()
        cursor = self.connection.execute(
            "INSERT INTO conversations (title, system_prompt, sampling, model_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (title, system_prompt, json.dumps(sampling.to_dict()), model_id, now, now),
        )
        return self.get(int(cursor.lastrowid))

    def get(self, conversation_id: int) -> Conversation:
        row = self.connection.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ? AND deleted_at IS NULL", (conversation_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        return _conversation(row)

    def exists(self, conversation_id: int) -> bool:
        if not -(2**63) <= conversation_id < 2**63:
            return False  # past SQLite's 64-bit integers no row can be; asked, SQLite raised OverflowError
        query = "SELECT 1 FROM conversations WHERE id = ? AND deleted_at IS NULL"
        return self.connection.execute(query, (conversation_id,)).fetchone() is not None

    def summaries(self, query: str = "") -> list[ConversationSummary]:
        """Conversations whose title or any message contains ``query`` (all when empty)."""
        if not query:
            rows = self.connection.execute(
                "SELECT id, title, updated_at, '' FROM conversations WHERE deleted_at IS NULL ORDER BY updated_at DESC"
            ).fetchall()
        else:
            rows = self.connection.execute(
                "SELECT c.id, c.title, c.updated_at,"
                " (SELECT m.content FROM messages m WHERE m.conversation_id = c.id AND instr(casefold(m.content), ?1)"
                "  ORDER BY m.id LIMIT 1)"
                " FROM conversations c WHERE c.deleted_at IS NULL"
                " AND (instr(casefold(c.title), ?1) OR EXISTS (SELECT 1 FROM messages m"
                "  WHERE m.conversation_id = c.id AND instr(casefold(m.content), ?1)))"
                " ORDER BY c.updated_at DESC",
                (query.casefold(),),
            ).fetchall()
        return [ConversationSummary(row[0], _text(row[1]), _text(row[2]), _snippet(_text(row[3]), query)) for row in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self._update_conversation(conversation_id, "title = ?", (title.strip() or DEFAULT_TITLE,))

    def configure(self, conversation_id: int, system_prompt: str, sampling: SamplingSettings) -> None:
        self._update_conversation(
            conversation_id, "system_prompt = ?, sampling = ?", (system_prompt, json.dumps(sampling.to_dict()))
        )

    def delete(self, conversation_id: int) -> None:
        """Hide a conversation; ``restore`` undoes it until ``purge_deleted`` runs."""
        self.connection.execute("UPDATE conversations SET deleted_at = ? WHERE id = ?", (now_iso(), conversation_id))

    def restore(self, conversation_id: int) -> None:
        self.connection.execute("UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self) -> int:
        return self.connection.execute("DELETE FROM conversations WHERE deleted_at IS NOT NULL").rowcount

    # Messages

    def add_message(self, conversation_id: int, parent_id: int | None, role: str, content: str, state: str) -> Message:
        """Append a message under ``parent_id`` and make it the end of the visible thread."""
        now = now_iso()
        with transaction(self.connection):
            cursor = self.connection.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, state, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent_id, role, content, state, now, now),
            )
            message_id = int(cursor.lastrowid)
            self.connection.execute(
                "UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                (message_id, now, conversation_id),
            )
        return self.message(message_id)

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        state: str | None = None,
        error: str | None = None,
        stats: dict | None = None,
        model_id: str | None = None,
    ) -> None:
        """Change the given fields. A ``model_id`` also becomes the conversation's: the model it last used."""
        changes = {
            "content": content,
            "state": state,
            "error": error,
            "stats": None if stats is None else json.dumps(stats),
            "model_id": model_id,
        }
        columns = [name for name, value in changes.items() if value is not None]
        now = now_iso()
        with transaction(self.connection):
            self.connection.execute(
                f"UPDATE messages SET {', '.join(f'{name} = ?' for name in columns + ['updated_at'])} WHERE id = ?",
                (*(changes[name] for name in columns), now, message_id),
            )
            if model_id:
                self.connection.execute(
                    "UPDATE conversations SET model_id = ? WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                    (model_id, message_id),
                )

    def message(self, message_id: int) -> Message:
        row = self.connection.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message {message_id}")
        return _message(row)

    def messages(self, conversation_id: int) -> list[Message]:
        """All messages of a conversation, earlier versions included, oldest first."""
        rows = self.connection.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [_message(row) for row in rows]

    def thread(self, conversation_id: int, leaf_id: int | None = None) -> list[ThreadEntry]:
        """The thread from the first message to ``leaf_id`` (by default the current leaf, so
        the visible thread), with version numbers."""
        leaf = self.get(conversation_id).current_leaf_id if leaf_id is None else leaf_id
        return visible_thread(self.messages(conversation_id), leaf)

    def select_version(self, message_id: int) -> None:
        """Show ``message_id`` instead of its siblings, continuing with its latest replies."""
        message = self.message(message_id)
        leaf = latest_leaf(self.messages(message.conversation_id), message_id)
        self._update_conversation(message.conversation_id, "current_leaf_id = ?", (leaf,))

    def mark_interrupted(self) -> int:
        """Replies that were streaming when the app last ended did not finish; say so."""
        return self.connection.execute(
            "UPDATE messages SET state = ? WHERE state = ?", (INTERRUPTED, STREAMING)
        ).rowcount

    def insert_transcripts(self, transcripts: Iterable[tuple[Conversation, Iterable[Message]]]) -> list[int]:
        """Recreate conversations with their own timestamps, all or none (a full disk half way
        adds nothing). Ids in each conversation and its messages are the transcript's; the
        database assigns new ones. Returns the new ids."""
        with transaction(self.connection):
            return [self._insert_transcript(conversation, messages) for conversation, messages in transcripts]

    def _insert_transcript(self, conversation: Conversation, messages: Iterable[Message]) -> int:
        cursor = self.connection.execute(
            "INSERT INTO conversations (title, system_prompt, sampling, model_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                conversation.title,
                conversation.system_prompt,
                json.dumps(conversation.sampling.to_dict()),
                conversation.model_id,
                conversation.created_at,
                conversation.updated_at,
            ),
        )
        new_conversation = int(cursor.lastrowid)
        new_ids: dict[int, int] = {}
        for message in messages:
            cursor = self.connection.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, state, error, model_id, stats,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    new_conversation,
                    None if message.parent_id is None else new_ids[message.parent_id],
                    message.role,
                    message.content,
                    message.state,
                    message.error,
                    message.model_id,
                    json.dumps(message.stats),
                    message.created_at,
                    message.updated_at,
                ),
            )
            new_ids[message.id] = int(cursor.lastrowid)
        leaf = conversation.current_leaf_id
        self.connection.execute(
            "UPDATE conversations SET current_leaf_id = ? WHERE id = ?",
            (None if leaf is None else new_ids[leaf], new_conversation),
        )
        return new_conversation

    def _update_conversation(self, conversation_id: int, assignments: str, values: tuple) -> None:
        self.connection.execute(
            f"UPDATE conversations SET {assignments}, updated_at = ? WHERE id = ?", (*values, now_iso(), conversation_id)
        )


def _snippet(content: str, query: str) -> str:
    if not content:
        return ""
    # The match a third in, but the window never runs past the end: a short message shows whole.
    # Found in the case-folded text: where folding changes a length (ß to ss) the window shifts a little.
    start = max(min(content.casefold().find(query.casefold()) - SNIPPET_CHARS // 3, len(content) - SNIPPET_CHARS), 0)
    text = " ".join(content[start : start + SNIPPET_CHARS].split())
    return ("…" if start else "") + text + ("…" if start + SNIPPET_CHARS < len(content) else "")


def _conversation(row: tuple) -> Conversation:
    sampling = SamplingSettings.from_dict(_json_object(row[3]) or {})
    return Conversation(row[0], _text(row[1]), _text(row[2]), sampling, _optional_text(row[4]), row[5], _text(row[6]), _text(row[7]))


def _message(row: tuple) -> Message:
    return Message(
        id=row[0],
        conversation_id=row[1],
        parent_id=row[2],
        role=_text(row[3]),
        content=_text(row[4]),
        created_at=_text(row[5]),
        updated_at=_text(row[6]),
        state=_text(row[7]),
        error=_optional_text(row[8]),
        model_id=_optional_text(row[9]),
        stats=_stats(row[10]),
    )


def _json_object(text: object) -> dict[str, Any] | None:
    """The JSON object stored in a column, or None where it holds anything else (a damaged or
    hand-edited database): one bad field must not make its conversation unopenable."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _stats(text: str) -> dict[str, Any]:
    """A reply's statistics as the engine writes them, or none (no line under the reply) where a
    figure is no number or a value is nested: formatting it would raise, and a JSON export with
    it would be refused on import."""
    stats = _json_object(text) or {}
    readable = all(
        is_number(value) or (key not in NUMBERS and (value is None or isinstance(value, (str, bool))))
        for key, value in stats.items()
    )
    return stats if readable else {}


def _text(value: object) -> str:
    """A text column's value as text: SQLite keeps what another program wrote there as it is, bytes
    or a number as well, and one such field hid every chat from the list (Qt takes no bytes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _optional_text(value: object) -> str | None:
    """``_text`` of a column that may hold no value (NULL), which stays ``None``."""
    return None if value is None else _text(value)
