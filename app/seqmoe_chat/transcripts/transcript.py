"""A conversation with all its messages: what every export format is written from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..store import Conversation, ConversationStore, Message, ThreadEntry
from ..store.records import FAILED, INTERRUPTED, STOPPED, USER
from ..store.threads import visible_thread


@dataclass
class Transcript:
    conversation: Conversation
    messages: list[Message]  # earlier versions included, oldest first

    def thread(self) -> list[ThreadEntry]:
        return visible_thread(self.messages, self.conversation.current_leaf_id)


def load_transcripts(store: ConversationStore, conversation_ids: Iterable[int]) -> list[Transcript]:
    return [Transcript(store.get(cid), store.messages(cid)) for cid in conversation_ids]


def store_transcripts(store: ConversationStore, transcripts: Iterable[Transcript]) -> list[int]:
    """Recreate the transcripts' conversations, all or none; returns their new ids."""
    return store.insert_transcripts((t.conversation, t.messages) for t in transcripts)


def speaker(message: Message) -> str:
    return "You" if message.role == USER else "Assistant"


def parse_time(timestamp: str) -> datetime:
    """``timestamp`` in local time; ``ValueError`` or ``OverflowError`` when it is no ISO time or none
    this computer's clock holds (year 1 in a zone east of UTC)."""
    return datetime.fromisoformat(timestamp).astimezone()


def local_time(timestamp: str) -> str:
    """``timestamp`` in local time; as it is when it is no time (a hand-edited database), so that the
    chat still exports."""
    try:
        return parse_time(timestamp).strftime("%Y-%m-%d %H:%M")
    except (ValueError, OverflowError):
        return timestamp


def state_note(message: Message) -> str:
    """Why a reply is incomplete, or nothing when it is complete."""
    if message.state == STOPPED:
        return "stopped"
    if message.state == INTERRUPTED:
        return "interrupted: the app closed before the reply finished"
    if message.state == FAILED:
        return f"failed: {message.error}" if message.error else "failed"
    return ""
