"""Streaming text from token ids: decode them all, hold back a half-decoded character."""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class TokenText:
    """Decoding the whole list each time gets spaces and multi-token characters right; a
    trailing U+FFFD is a character whose remaining bytes are still to come."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []

    def add(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    @property
    def count(self) -> int:
        return len(self.token_ids)

    def text(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True).rstrip("\ufffd")
