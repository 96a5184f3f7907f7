"""The text a user sees of a reply, from its token ids: while they stream, and once it is whole.

Most models' replies are their tokens decoded. gpt-oss answers in OpenAI's harmony format,
messages on named channels (the chat template's generation prompt ends with
``<|start|>assistant``, so the reply opens with ``<|channel|>``)::

    <|channel|>analysis<|message|>reasoning<|end|><|start|>assistant<|channel|>final<|message|>answer<|return|>

Decoded with the special tokens skipped, that reads "analysis reasoning assistant final answer",
and a chat that sends the reply back as its next turn's history carries all of it along. Here
only the ``final`` channel is the answer and ``analysis`` is the reasoning; other channels
(``commentary``: tool calls and their preambles) are neither. A harmony reply cut off before its
final channel began (the token limit, Stop) has an empty answer, as one still streaming its
analysis shows none yet: the analysis is the model thinking aloud, and shown or stored as the
answer it would mislead. ``reasoning()`` holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

ANSWER_CHANNEL = "final"
REASONING_CHANNEL = "analysis"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class _Markers:
    """The ids of harmony's special tokens in one tokenizer; ``None``: a marker it lacks."""

    start: int | None
    channel: int
    message: int
    constrain: int | None
    ends: frozenset[int]  # <|end|>, <|return|> and <|call|>: each closes a message

    @cached_property
    def all(self) -> frozenset[int]:
        named = (self.start, self.channel, self.message, self.constrain)
        return self.ends | {marker for marker in named if marker is not None}


def _harmony_markers(tokenizer: Decoder) -> _Markers | None:
    """The harmony markers of ``tokenizer``, or ``None`` where it has no ``<|channel|>`` and
    ``<|message|>``: then its replies are plain text."""
    to_id = getattr(tokenizer, "convert_tokens_to_ids", None)
    to_token = getattr(tokenizer, "convert_ids_to_tokens", None)
    if to_id is None or to_token is None:
        return None

    def find(token: str) -> int | None:
        # Looked up one by one: get_vocab() builds gpt-oss's 200k-token vocabulary, 0.1 s a reply.
        # A token the tokenizer lacks converts to the unknown token's id (or None), so check it back.
        token_id = to_id(token)
        return token_id if isinstance(token_id, int) and to_token(token_id) == token else None

    channel, message = find("<|channel|>"), find("<|message|>")
    if channel is None or message is None:
        return None
    ends = frozenset(token_id for token in ("<|end|>", "<|return|>", "<|call|>") if (token_id := find(token)) is not None)
    return _Markers(find("<|start|>"), channel, message, find("<|constrain|>"), ends)


class _HarmonyMessages:
    """The content ids of a harmony reply's messages, by channel, as its tokens arrive."""

    def __init__(self, tokenizer: Decoder, markers: _Markers) -> None:
        self.tokenizer = tokenizer
        self.markers = markers
        self.by_channel: dict[str, list[list[int]]] = {}
        """Each channel's messages, each its content ids."""
        self.header: list[int] = []  # the current message's role and channel, up to <|message|>
        self.content: list[int] | None = None  # the current message's content ids; None: in a header

    def add(self, token_id: int) -> None:
        markers = self.markers
        if self.content is None:
            if token_id == markers.message:
                self.content = []
                self.by_channel.setdefault(self._channel(), []).append(self.content)
            elif token_id == markers.start or token_id in markers.ends:
                self.header = []
            else:
                self.header.append(token_id)
        elif token_id in markers.all:
            # A marker ends the content; one that opens a header (a model that left out
            # <|end|><|start|>assistant) begins the next message's.
            self.content = None
            self.header = [token_id] if token_id == markers.channel else []
        else:
            self.content.append(token_id)

    def _channel(self) -> str:
        """The channel named in the header: its first word, without a recipient ("commentary
        to=functions.x") or a content type after <|constrain|>; "" where it names none."""
        header = self.header
        if self.markers.channel not in header:
            return ""
        name = header[len(header) - header[::-1].index(self.markers.channel) :]
        if self.markers.constrain in name:
            name = name[: name.index(self.markers.constrain)]
        words = self.tokenizer.decode(name, skip_special_tokens=True).split()
        return words[0] if words else ""


class ReplyText:
    """A reply's visible text from its token ids, added one by one as they stream.

    Decoding the whole list each time gets spaces and multi-token characters right; a trailing
    U+FFFD is a character whose remaining bytes are still to come, so it is held back.
    """

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._markers = _harmony_markers(tokenizer)
        self._harmony: _HarmonyMessages | None = None

    @classmethod
    def of(cls, tokenizer: Decoder, token_ids: list[int]) -> ReplyText:
        """The text of a whole reply."""
        reply = cls(tokenizer)
        for token_id in token_ids:
            reply.add(token_id)
        return reply

    def add(self, token_id: int) -> None:
        # A reply that does not open with a marker is plain text, though its tokenizer knows
        # harmony: gpt-oss continuing a prompt given as plain text rather than as a chat.
        if not self.token_ids and self._markers is not None and token_id in self._markers.all:
            self._harmony = _HarmonyMessages(self.tokenizer, self._markers)
        self.token_ids.append(token_id)
        if self._harmony is not None:
            self._harmony.add(token_id)

    @property
    def count(self) -> int:
        return len(self.token_ids)

    def text(self) -> str:
        """The answer so far: a harmony reply's final channel, any other reply all of it."""
        if self._harmony is None:
            return self._decode(self.token_ids)
        return self._channel_text(ANSWER_CHANNEL)

    def reasoning(self) -> str:
        """A harmony reply's analysis so far; "" for a model that does not reason aloud."""
        if self._harmony is None:
            return ""
        return self._channel_text(REASONING_CHANNEL)

    def _channel_text(self, channel: str) -> str:
        # Each message decoded on its own, a blank line between them: decoded together, a
        # byte-level tokenizer ran the end of one into the next ("...me.Let me...").
        assert self._harmony is not None
        texts = (self._decode(message) for message in self._harmony.by_channel.get(channel, []))
        return "\n\n".join(text for text in texts if text)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).rstrip("\ufffd")
