"""Code block colours: kept for blocks already lexed, within a size bound while replies stream."""

from __future__ import annotations

from PySide6.QtGui import QTextCursor, QTextDocument

from seqmoe_chat import code_highlight
from seqmoe_chat.code_highlight import _SpanCache, highlight_code_blocks

CODE = "".join(f"def f{i}(x):\n    return x * {i}  # step {i}\n" for i in range(200))


def test_a_streaming_code_block_keeps_one_version_of_its_colours(qtbot) -> None:
    cache = _SpanCache(budget=10**9)
    for end in range(100, len(CODE), 100):  # a redraw at every step of the reply
        cache.get(CODE[:end], "python", "default")
    assert cache.chars == len(CODE[:end])


def test_colours_kept_stay_within_their_budget_dropping_the_least_recently_used(qtbot) -> None:
    cache = _SpanCache(budget=3000)
    blocks = [f"x{i} = {i}\n" * 100 for i in range(5)]  # 700 to 800 characters each, none a prefix of another
    for block in blocks:
        cache.get(block, "python", "default")
    cache.get(blocks[2], "python", "default")  # used again: kept
    cache.get("y = 1\n" * 200, "python", "default")
    assert cache.chars <= 3000
    assert set(cache._spans) >= {(blocks[2], "python", "default"), ("y = 1\n" * 200, "python", "default")}
    assert (blocks[0], "python", "default") not in cache._spans


def test_a_streamed_block_is_coloured_as_the_finished_one(qtbot, monkeypatch) -> None:
    monkeypatch.setattr(code_highlight, "_SPANS", _SpanCache(budget=10**9))
    for end in (len(CODE) // 3, len(CODE)):
        document = QTextDocument()
        document.setMarkdown(f"Here:\n\n```python\n{CODE[:end]}```\n")
        highlight_code_blocks(document, dark=False)
    fresh = QTextDocument()
    fresh.setMarkdown(f"Here:\n\n```python\n{CODE}```\n")
    monkeypatch.setattr(code_highlight, "_SPANS", _SpanCache(budget=10**9))
    highlight_code_blocks(fresh, dark=False)
    assert document.toHtml() == fresh.toHtml() and "color:" in fresh.toHtml()


def colours(document: QTextDocument, word: str) -> list[str]:
    found = document.find(word)
    cursor = QTextCursor(document)
    shown = []
    for position in range(found.selectionStart() + 1, found.selectionEnd() + 1):
        cursor.setPosition(position)  # the format of the character before it
        shown.append(cursor.charFormat().foreground().color().name())
    return shown


def test_an_emoji_in_a_code_block_leaves_the_colours_after_it_in_place(qtbot) -> None:
    # Pygments counts one character per emoji, Qt two: every token after it was coloured one place late.
    documents = []
    for text in ('s = "ab"  # note\nimport os\n', 's = "😀🚀"  # note\nimport os\n'):
        document = QTextDocument()
        document.setMarkdown(f"```python\n{text}```\n")
        highlight_code_blocks(document, dark=False)
        documents.append(document)
    plain, emoji = ([colours(d, "# note"), colours(d, "import os")] for d in documents)
    assert emoji == plain and len(set(plain[1])) > 1  # "import" and "os" differ
