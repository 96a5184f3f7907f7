"""Pygments colours for the code blocks of a document that Qt's Markdown reader made."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import OrderedDict
from functools import lru_cache

from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from PySide6.QtGui import QColor, QFont, QFontDatabase, QTextBlock, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

LIGHT_STYLE = "default"
DARK_STYLE = "monokai"
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")
"""A character that takes two UTF-16 units."""


def highlight_code_blocks(document: QTextDocument, dark: bool) -> None:
    """Give every fenced or indented code block a background, a fixed-pitch font and
    token colours for its language."""
    style = DARK_STYLE if dark else LIGHT_STYLE
    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    block = document.begin()
    while block.isValid():
        if not _is_code(block):
            block = block.next()
            continue
        first, lines = block, []
        language = str(block.blockFormat().property(QTextFormat.Property.BlockCodeLanguage) or "")
        while block.isValid() and _is_code(block):
            lines.append(block.text())
            last = block
            block = block.next()
        _colour_run(cursor, first, last, "\n".join(lines), language, style)
    cursor.endEditBlock()


def _is_code(block: QTextBlock) -> bool:
    block_format = block.blockFormat()
    return block_format.hasProperty(QTextFormat.Property.BlockCodeFence) or block_format.hasProperty(
        QTextFormat.Property.BlockCodeLanguage
    )


def _colour_run(cursor: QTextCursor, first: QTextBlock, last: QTextBlock, code: str, language: str, style: str) -> None:
    start = first.position()
    cursor.setPosition(start)
    cursor.setPosition(last.position() + last.length() - 1, QTextCursor.MoveMode.KeepAnchor)
    block_format = cursor.blockFormat()
    block_format.setBackground(QColor(get_style_by_name(style).background_color))
    cursor.mergeBlockFormat(block_format)
    base = QTextCharFormat()
    base.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    cursor.mergeCharFormat(base)
    # Span positions (UTF-16 units) equal document positions from ``start``: one separator per line break.
    for index, length, char_format in _SPANS.get(code, language, style):
        cursor.setPosition(start + index)
        cursor.setPosition(start + index + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(char_format)


Spans = tuple[tuple[int, int, QTextCharFormat], ...]
SPAN_CACHE_CHARS = 1_000_000
"""Characters of code whose colours are kept (about 25 bytes of spans a character): the blocks of
many chats. Bounded by size, not by count: a streaming reply's code block is a new string at every
redraw, and 512 versions of one 66 KB block held 289 MiB."""


class _SpanCache:
    """The coloured spans of recent code blocks, least recently used dropped first. Lexing took most
    of the time of showing a chat (6.8 s of 11.6 s for 2000 messages), and a streaming reply is
    shown anew at every step with its finished blocks unchanged: each block is lexed once. A block
    that extends the one cached last (the same block, streaming) takes its place."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._spans: OrderedDict[tuple[str, str, str], Spans] = OrderedDict()
        self._chars = 0

    @property
    def chars(self) -> int:
        return self._chars

    def get(self, code: str, language: str, style: str) -> Spans:
        key = (code, language, style)
        spans = self._spans.get(key)
        if spans is not None:
            self._spans.move_to_end(key)
            return spans
        spans = _lexed(code, language, style)
        if self._spans:
            last = next(reversed(self._spans))
            if last[1:] == key[1:] and code.startswith(last[0]):
                self._drop(last)
        self._spans[key] = spans
        self._chars += len(code)
        while self._chars > self.budget and len(self._spans) > 1:
            self._drop(next(iter(self._spans)))
        return spans

    def _drop(self, key: tuple[str, str, str]) -> None:
        del self._spans[key]
        self._chars -= len(key[0])


def _lexed(code: str, language: str, style: str) -> Spans:
    """(index, length, format) of the coloured tokens of ``code``, in UTF-16 units as Qt counts
    positions: Pygments counts code points, and each emoji (or other character beyond U+FFFF) before
    a token would shift its colours one place."""
    astral = [match.start() for match in _ASTRAL.finditer(code)]
    spans = []
    for index, token, value in _lexer(language).get_tokens_unprocessed(code):
        char_format = _token_format(style, token)
        if char_format is not None:
            start = index + bisect_left(astral, index)
            end = index + len(value) + bisect_left(astral, index + len(value))
            spans.append((start, end - start, char_format))
    return tuple(spans)


_SPANS = _SpanCache(SPAN_CACHE_CHARS)


@lru_cache(maxsize=64)
def _lexer(language: str):
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


@lru_cache(maxsize=1024)
def _token_format(style: str, token: _TokenType) -> QTextCharFormat | None:
    spec = get_style_by_name(style).style_for_token(token)
    if not (spec["color"] or spec["bold"] or spec["italic"]):
        return None
    char_format = QTextCharFormat()
    if spec["color"]:
        char_format.setForeground(QColor(f"#{spec['color']}"))
    if spec["bold"]:
        char_format.setFontWeight(QFont.Weight.Bold)
    if spec["italic"]:
        char_format.setFontItalic(True)
    return char_format
