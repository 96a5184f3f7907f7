"""The lossless JSON transcript: export, validation and import.

Version 1 holds, per conversation, the title, system prompt, sampling settings, model
id, timestamps and every message (earlier versions included) with its role, state,
error, model id, statistics and timestamps. Message ids are local to the file; parents
and the visible thread's end refer to them.
"""

from __future__ import annotations

import json
from typing import Any

from ..store import Conversation, ConversationStore, Message, SamplingSettings
from ..store.records import ROLES, STATES, now_iso
from .transcript import Transcript

FORMAT = "seqmoe-chat-transcript"
VERSION = 1


class TranscriptError(ValueError):
    """A file that is not a transcript this app can read; the message says why."""


def to_json(transcripts: list[Transcript]) -> str:
    document = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": now_iso(),
        "conversations": [_conversation_dict(t) for t in transcripts],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def _conversation_dict(transcript: Transcript) -> dict[str, Any]:
    local = {message.id: number for number, message in enumerate(transcript.messages, start=1)}
    conversation = transcript.conversation
    return {
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "sampling": conversation.sampling.to_dict(),
        "model_id": conversation.model_id,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "current_message": local.get(conversation.current_leaf_id) if conversation.current_leaf_id else None,
        "messages": [
            {
                "id": local[message.id],
                "parent": None if message.parent_id is None else local[message.parent_id],
                "role": message.role,
                "content": message.content,
                "state": message.state,
                "error": message.error,
                "model_id": message.model_id,
                "stats": message.stats,
                "created_at": message.created_at,
                "updated_at": message.updated_at,
            }
            for message in transcript.messages
        ],
    }


def from_json(text: str) -> list[Transcript]:
    """Transcripts with file-local ids; raises TranscriptError on anything malformed."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise TranscriptError(f"not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TranscriptError("not a SeqMoE Chat transcript")
    if not isinstance(document.get("version"), int) or document["version"] > VERSION:
        raise TranscriptError(f"transcript version {document.get('version')!r} is newer than this app reads ({VERSION})")
    try:
        return [_transcript(item) for item in document["conversations"]]
    except (KeyError, TypeError, ValueError) as error:
        raise TranscriptError(f"a conversation in the transcript is malformed ({type(error).__name__}: {error})") from None


def _transcript(item: dict[str, Any]) -> Transcript:
    messages = [_message(entry) for entry in item["messages"]]
    known = set()
    for message in messages:
        if message.parent_id is not None and message.parent_id not in known:
            raise ValueError(f"message {message.id} comes before its parent {message.parent_id}")
        known.add(message.id)
    current = item.get("current_message")
    if current is not None and current not in known:
        raise ValueError(f"current message {current} does not exist")
    conversation = Conversation(
        id=0,
        title=str(item["title"]),
        system_prompt=str(item.get("system_prompt", "")),
        sampling=SamplingSettings.from_dict(item.get("sampling", {})),
        model_id=str(item.get("model_id", "")),
        current_leaf_id=current,
        created_at=str(item["created_at"]),
        updated_at=str(item["updated_at"]),
    )
    return Transcript(conversation, messages)


def _message(entry: dict[str, Any]) -> Message:
    if entry["role"] not in ROLES:
        raise ValueError(f"unknown role {entry['role']!r}")
    if entry.get("state", "done") not in STATES:
        raise ValueError(f"unknown state {entry['state']!r}")
    stats = entry.get("stats", {})
    if not isinstance(stats, dict):
        raise ValueError("stats must be an object")
    return Message(
        id=int(entry["id"]),
        conversation_id=0,
        parent_id=None if entry.get("parent") is None else int(entry["parent"]),
        role=entry["role"],
        content=str(entry["content"]),
        created_at=str(entry["created_at"]),
        updated_at=str(entry.get("updated_at", entry["created_at"])),
        state=entry.get("state", "done"),
        error=str(entry.get("error", "")),
        model_id=str(entry.get("model_id", "")),
        stats=stats,
    )


def import_json(store: ConversationStore, text: str) -> list[int]:
    """Recreate every conversation of a JSON transcript; returns their new ids."""
    return [store.insert_transcript(t.conversation, t.messages) for t in from_json(text)]
