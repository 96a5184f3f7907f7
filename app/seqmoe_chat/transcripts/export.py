"""Writing transcripts in the four export formats.

Markdown, HTML and plain text show what a reader saw: the visible thread of each
conversation. JSON keeps everything, earlier versions included, for re-import.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..atomic_file import ordinary_file_mode, write_text_atomically
from .fences import unclosed_fence
from .html_format import to_html
from .json_format import to_json
from .reply_stats import stats_line
from .transcript import Transcript, local_time, speaker, state_note

FORMAT_NAMES = {"md": "Markdown", "json": "JSON", "html": "HTML", "txt": "Plain text"}


def to_markdown(transcripts: list[Transcript]) -> str:
    return "\n---\n\n".join(_markdown_conversation(t) for t in transcripts)


def _markdown_conversation(transcript: Transcript) -> str:
    conversation = transcript.conversation
    about = [f"created {local_time(conversation.created_at)}"]
    if conversation.model_id:
        about.insert(0, f"model {conversation.model_id}")
    lines = [f"# {conversation.title}", "", f"*{' · '.join(about)} · exported from SeqMoE Chat*", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", ""] + [f"> {line}" for line in conversation.system_prompt.splitlines()] + [""]
    for entry in transcript.thread():
        message = entry.message
        lines += [f"### {speaker(message)} · {local_time(message.created_at)}", "", _closed_fences(message.content), ""]
        notes = [note for note in (state_note(message), stats_line(message.stats)) if note]
        if notes:
            lines += [f"*{' · '.join(notes)}*", ""]
    return "\n".join(lines)


def _closed_fences(content: str) -> str:
    """A reply stopped inside a code block, closed: else the rest of the file would read as code."""
    fence = unclosed_fence(content)
    if not fence:
        return content
    return content + ("" if content.endswith("\n") else "\n") + fence


def to_text(transcripts: list[Transcript]) -> str:
    return "\n\n".join(_text_conversation(t) for t in transcripts)


def _text_conversation(transcript: Transcript) -> str:
    conversation = transcript.conversation
    lines = [conversation.title, "=" * len(conversation.title)]
    if conversation.model_id:
        lines.append(f"Model: {conversation.model_id}")
    lines.append(f"Created: {local_time(conversation.created_at)}")
    if conversation.system_prompt:
        lines.append(f"System prompt: {conversation.system_prompt}")
    for entry in transcript.thread():
        message = entry.message
        lines += ["", f"[{speaker(message)}, {local_time(message.created_at)}]", message.content]
        lines += [f"({note})" for note in (state_note(message), stats_line(message.stats)) if note]
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[list[Transcript]], str]] = {
    "md": to_markdown,
    "json": to_json,
    "html": to_html,
    "txt": to_text,
}


def render(transcripts: list[Transcript], fmt: str) -> str:
    if fmt not in RENDERERS:
        raise ValueError(f"unknown export format {fmt!r}; choose {', '.join(RENDERERS)}")
    return RENDERERS[fmt](transcripts)


def write_export(path: Path, transcripts: list[Transcript], fmt: str) -> None:
    """Write atomically: a temporary file beside ``path``, then a rename, so an existing
    file is never left half-written. The file gets the permissions of any file the user
    saves (an existing one keeps its own): an export is meant to be shared."""
    write_text_atomically(path, render(transcripts, fmt), mode=ordinary_file_mode(path))


def format_for(path: Path) -> str | None:
    """The export format a file name asks for, by its extension; ``None``: no extension or
    one of no export format."""
    suffix = Path(path).suffix.lower().lstrip(".")
    fmt = {"markdown": "md", "htm": "html", "text": "txt"}.get(suffix, suffix)
    return fmt if fmt in FORMAT_NAMES else None


def export_target(path: Path, chosen: str) -> tuple[Path, str]:
    """The file and format of an export to ``path`` with the format ``chosen`` in the dialog:
    an extension typed in the name wins (``notes.json`` is JSON, whatever the filter);
    a name without an extension gets the chosen format's."""
    typed = format_for(path)
    if typed is not None:
        return path, typed
    return (path if path.suffix else path.with_name(f"{path.name}.{chosen}")), chosen
