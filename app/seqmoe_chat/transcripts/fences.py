"""Fenced code blocks in Markdown text, found the way CommonMark finds them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPENING = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")


@dataclass
class Segment:
    """A run of prose (``code`` False) or one fenced code block. ``source`` is the
    original text of the run, fences included; ``text`` is the code itself."""

    source: str
    text: str
    code: bool = False
    language: str = ""
    closed: bool = True
    fence: str = ""
    """The run of backticks or tildes that opened a code block."""


def split_fences(markdown: str) -> list[Segment]:
    segments: list[Segment] = []
    prose: list[str] = []
    lines = markdown.splitlines(keepends=True)
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index].rstrip("\r\n"))
        if opening is None:
            prose.append(lines[index])
            index += 1
            continue
        if prose:
            segments.append(Segment("".join(prose), "".join(prose)))
            prose = []
        fence = opening["fence"]
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((i for i in range(index + 1, len(lines)) if closing.match(lines[i].rstrip("\r\n"))), None)
        body_end = len(lines) if end is None else end
        # As CommonMark: a fence indented under a list item takes that indentation off its lines.
        indent = len(lines[index]) - len(lines[index].lstrip(" "))
        code = "".join(_dedented(line, indent) for line in lines[index + 1 : body_end])
        source = "".join(lines[index : body_end + (0 if end is None else 1)])
        language = opening["info"].split()[0] if opening["info"].strip() else ""
        segments.append(Segment(source, code.removesuffix("\n"), True, language, end is not None, fence))
        index = body_end + 1
    if prose:
        segments.append(Segment("".join(prose), "".join(prose)))
    return segments


def _dedented(line: str, indent: int) -> str:
    """``line`` without up to ``indent`` leading spaces; a line indented less keeps its text."""
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def unclosed_fence(markdown: str) -> str:
    """The fence that would close a code block left open at the end of ``markdown`` (a reply
    stopped mid-block), or "" when every block is closed."""
    segments = split_fences(markdown)
    return segments[-1].fence if segments and not segments[-1].closed else ""


def code_blocks(markdown: str) -> list[Segment]:
    """The closed code blocks, in order: what a "copy code" action can offer."""
    return [segment for segment in split_fences(markdown) if segment.code and segment.closed]
