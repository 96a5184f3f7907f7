"""The lossless JSON transcript: writing it, and reading a file of it back with validation.

Version 1 holds, per conversation, the title, system prompt, sampling settings, model
id, timestamps and every message (earlier versions included) with its role, state,
error, model id, statistics and timestamps. Message ids are local to the file; parents
and the visible thread's end refer to them.

Import is strict, so that nothing imported can break the chat or an export later: every
value must be one the app could have written (valid Unicode text, dates and times that
parse, finite numbers, sampling settings the settings fields allow, statistics the chat can
show). A file with any other value, null included, is refused with the field and where it
is, and nothing of it is imported. Only a field that is missing takes a default (system
prompt, sampling or any one setting, model id, state "done", error, statistics, a message's
updated_at from its created_at): a missing field holds nothing its writer meant. Null means
"none" only where the app writes it: a message's parent, the current message, the seed.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from ..store import Conversation, Message, SamplingSettings
from ..store.records import (
    DONE,
    INTERRUPTED,
    MAX_NEW_TOKENS,
    ROLES,
    SEEDS,
    STATES,
    STREAMING,
    TEMPERATURES,
    TOP_PS,
    now_iso,
)
from ..store.threads import children_of, latest_leaf
from .json_values import Fields, TranscriptError, is_unicode
from .reply_stats import NUMBERS
from .transcript import Transcript

FORMAT = "seqmoe-chat-transcript"
VERSION = 1
__all__ = ["FORMAT", "VERSION", "TranscriptError", "from_json", "read_json", "to_json"]

# JSON files are UTF-8, but Windows' Notepad saves "Unicode" as UTF-16 with a byte order mark, and a
# mark names its encoding. UTF-32's little-endian mark starts with UTF-16's, so it is tried first.
_MARKED_ENCODINGS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                     (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


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
        # A byte order mark, as Windows' Notepad saves UTF-8, starts no JSON but means nothing else.
        document = json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as error:
        raise TranscriptError(f"not JSON: {error}") from None
    except RecursionError:
        raise TranscriptError("not JSON this app can read: it is nested too deeply") from None
    except ValueError:  # Python's limit on the digits of an integer
        raise TranscriptError("not JSON this app can read: it holds a number with too many digits") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TranscriptError("not a SeqMoE Chat transcript")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TranscriptError(f"transcript version {version!r} is not one this app reads")
    if version > VERSION:
        raise TranscriptError(f"transcript version {version} is newer than this app reads ({VERSION})")
    return [_transcript(item) for item in Fields(document, "").objects("conversations", "conversation")]


def _transcript(item: Fields) -> Transcript:
    messages = [_message(entry) for entry in item.objects("messages", "message")]
    known = set()
    for message in messages:
        if message.id in known:
            raise TranscriptError(f"{item.where}: two messages have the id {message.id}")
        if message.parent_id is not None and message.parent_id not in known:
            raise TranscriptError(f"{item.where}: message {message.id} comes before its parent {message.parent_id}")
        known.add(message.id)
    current = item.optional_integer("current_message")
    if current is not None and current not in known:
        raise TranscriptError(f"{item.where}: current message {current} does not exist")
    if current is None and messages:
        # A file written by hand or by another tool may name none: the newest line is shown, as
        # the app shows a new version. With none, the chat opened empty.
        current = latest_leaf(messages, children_of(messages)[None][-1])
    conversation = Conversation(
        id=0,
        title=item.text("title"),
        system_prompt=item.text("system_prompt", ""),
        sampling=_sampling(item.object("sampling", {})),
        model_id=item.text("model_id", ""),
        current_leaf_id=current,
        created_at=item.timestamp("created_at"),
        updated_at=item.timestamp("updated_at"),
    )
    return Transcript(conversation, messages)


def _sampling(sampling: Fields) -> SamplingSettings:
    defaults = SamplingSettings()
    return SamplingSettings(
        temperature=sampling.number("temperature", defaults.temperature, TEMPERATURES),
        top_p=sampling.number("top_p", defaults.top_p, TOP_PS),
        max_new_tokens=sampling.integer("max_new_tokens", defaults.max_new_tokens, MAX_NEW_TOKENS),
        seed=sampling.optional_integer("seed", SEEDS),
    )


def _message(entry: Fields) -> Message:
    created_at = entry.timestamp("created_at")
    state = entry.choice("state", STATES, DONE)
    return Message(
        id=entry.integer("id"),
        conversation_id=0,
        parent_id=entry.optional_integer("parent"),
        role=entry.choice("role", ROLES),
        content=entry.text("content"),
        created_at=created_at,
        updated_at=entry.timestamp("updated_at", created_at),
        # Exported while it streamed: no engine will ever finish it here, as after a crash.
        state=INTERRUPTED if state == STREAMING else state,
        error=entry.text("error", ""),
        model_id=entry.text("model_id", ""),
        stats=_stats(entry.object("stats", {})),
    )


def _stats(stats: Fields) -> dict[str, Any]:
    """Statistics as the engine writes them: numbers where the chat shows a figure, else a
    number, text, true, false or null, never a nested value."""
    for key, value in stats.values.items():
        if not is_unicode(key):
            raise TranscriptError(f"{stats.where}: a name holds a character that is not valid Unicode")
        if key in NUMBERS or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            stats.number(key)  # finite too: an export would write NaN, which is not JSON
        elif isinstance(value, str):
            stats.text(key)
        elif value is not None and not isinstance(value, bool):
            raise stats.error(key, "must be a number, text, true, false or null")
    return stats.values


def read_json(path: Path) -> list[Transcript]:
    """The transcripts of a JSON transcript file, with file-local ids; OSError when it cannot be
    read, TranscriptError when it holds no transcript."""
    return from_json(_decoded(path.read_bytes()))


def _decoded(data: bytes) -> str:
    encoding = next((name for mark, name in _MARKED_ENCODINGS if data.startswith(mark)), "utf-8")
    try:
        return data.decode(encoding)  # UTF-16's and UTF-32's codecs drop the mark; from_json drops UTF-8's
    except UnicodeDecodeError:
        # The codec's own words ("can't decode byte 0xe9 in position 41") tell people nothing.
        raise TranscriptError(f"not a {encoding.upper()} text file, so not a SeqMoE Chat transcript") from None
