"""A self-contained HTML transcript: one file, inline styles, readable on screen and on paper.

Message text is Markdown; this writes its code blocks highlighted (Pygments, inline
styles), paragraphs, line breaks, inline code and bold, and shows the rest as written.
"""

from __future__ import annotations

import re
from html import escape

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from .fences import split_fences
from .reply_stats import stats_line
from .transcript import Transcript, local_time, speaker, state_note

_STYLE = """
body { font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       max-width: 52rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
.about, .meta, .note { color: #656d76; font-size: .85rem; }
.system { border-left: 3px solid #d0d7de; padding: .2rem .8rem; color: #424a53; white-space: pre-wrap; }
.message { margin: 1.2rem 0; padding: .6rem .9rem; border-radius: 8px; }
.user { background: #f0f3f7; }
.speaker { font-weight: 600; }
pre { background: #f6f8fa; padding: .7rem; border-radius: 6px; overflow-x: auto; white-space: pre-wrap; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .9em; }
hr { border: none; border-top: 1px solid #d0d7de; margin: 2.5rem 0; }
@media print {
  body { max-width: none; margin: 0; }
  .message, pre { break-inside: avoid; }
  .user { background: none; border-left: 3px solid #d0d7de; }
}
"""
_FORMATTER = HtmlFormatter(noclasses=True, nowrap=True, style="default")


def to_html(transcripts: list[Transcript]) -> str:
    title = transcripts[0].conversation.title if len(transcripts) == 1 else "SeqMoE Chat conversations"
    body = "\n<hr>\n".join(_conversation(t) for t in transcripts)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _conversation(transcript: Transcript) -> str:
    conversation = transcript.conversation
    about = f"created {local_time(conversation.created_at)}"
    if conversation.model_id:
        about = f"model {escape(conversation.model_id)} · {about}"
    parts = [f"<article>\n<h1>{escape(conversation.title)}</h1>", f"<p class=\"about\">{about} · exported from SeqMoE Chat</p>"]
    if conversation.system_prompt:
        parts.append(f"<p class=\"system\"><strong>System prompt:</strong> {escape(conversation.system_prompt)}</p>")
    for entry in transcript.thread():
        message = entry.message
        notes = "".join(
            f"<p class=\"note\">{escape(note)}</p>" for note in (state_note(message), stats_line(message.stats)) if note
        )
        parts.append(
            f"<section class=\"message {message.role}\">\n"
            f"<p class=\"meta\"><span class=\"speaker\">{speaker(message)}</span> · {local_time(message.created_at)}</p>\n"
            f"{markdown_html(message.content)}\n{notes}</section>"
        )
    return "\n".join(parts) + "\n</article>"


def markdown_html(text: str) -> str:
    html = []
    for segment in split_fences(text):
        if segment.code:
            html.append(f"<pre><code>{highlight(segment.text, _lexer(segment.language), _FORMATTER)}</code></pre>")
        else:
            paragraphs = re.split(r"\n[ \t]*\n", segment.text.strip("\n"))
            html += [f"<p>{_inline(p)}</p>" for p in paragraphs if p.strip()]
    return "\n".join(html)


def _inline(paragraph: str) -> str:
    pieces = re.split(r"(`[^`\n]+`)", paragraph)
    out = []
    for piece in pieces:
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1:
            out.append(f"<code>{escape(piece[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escape(piece)).replace("\n", "<br>\n"))
    return "".join(out)


def _lexer(language: str):
    try:
        return get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()
