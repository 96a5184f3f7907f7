"""Export in every format and the lossless JSON round trip, without Qt."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from seqmoe_chat.store import ConversationStore, SamplingSettings, open_database
from seqmoe_chat.store.records import ASSISTANT, DONE, STOPPED, USER
from seqmoe_chat.transcripts.export import export_target, format_for, render, write_export
from seqmoe_chat.transcripts.fences import code_blocks, split_fences
from seqmoe_chat.transcripts.json_format import TranscriptError, from_json, to_json
from seqmoe_chat.transcripts.transcript import load_transcripts, store_transcripts

REPLY = "Here is code:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nUse **it** with `add(1, 2)` <ok>."
STATS = {"tokens": 42, "tokens_per_s": 31.25, "time_to_first_token": 0.21, "hit_rate": 0.969, "stall_seconds": 0.03}


@pytest.fixture
def store(tmp_path: Path) -> ConversationStore:
    return ConversationStore(open_database(tmp_path / "chats.sqlite3").connection)


@pytest.fixture
def conversation_id(store: ConversationStore) -> int:
    sampling = SamplingSettings(temperature=0.5, top_p=0.95, max_new_tokens=100, seed=11)
    conversation = store.create(title="Adding numbers", system_prompt="You are a terse tutor.", sampling=sampling)
    first = store.add_message(conversation.id, None, USER, "How do I add?", DONE)
    old = store.add_message(conversation.id, first.id, ASSISTANT, "Old answer", STOPPED)
    store.update_message(old.id, model_id="tiny")
    question = store.add_message(conversation.id, None, USER, "How do I add in Python?", DONE)
    reply = store.add_message(conversation.id, question.id, ASSISTANT, "", DONE)
    store.update_message(reply.id, content=REPLY, stats=STATS, model_id="tiny")
    return conversation.id


def test_markdown_shows_the_visible_thread_with_prompt_and_stats(store: ConversationStore, conversation_id: int) -> None:
    text = render(load_transcripts(store, [conversation_id]), "md")
    assert text.startswith("# Adding numbers")
    assert "> You are a terse tutor." in text
    assert "How do I add in Python?" in text and "```python\ndef add(a, b):" in text
    assert "Old answer" not in text
    assert "42 tokens · 31.2 tok/s · first token 0.21 s · hit rate 96.9% · stalls 0.03 s" in text


def test_a_reply_cut_by_a_full_context_says_so_in_its_line() -> None:
    from seqmoe_chat.transcripts.reply_stats import stats_line

    assert stats_line({**STATS, "context_full": True}).endswith("stalls 0.03 s · stopped where the context was full")
    assert "context" not in stats_line({**STATS, "context_full": False})


def test_a_replys_line_gives_the_speed_and_hit_rate_of_generating_when_the_stats_have_them() -> None:
    from seqmoe_chat.transcripts.reply_stats import stats_line

    decoded = {**STATS, "decode_tokens_per_s": 40.0, "decode_hit_rate": 0.99}
    assert stats_line(decoded).startswith("42 tokens · 40.0 tok/s · first token 0.21 s · hit rate 99.0%")
    # One token is all prompt: its whole figures; as are those stored before the decode ones were.
    assert stats_line({**decoded, "tokens": 1}).startswith("1 token · 31.2 tok/s · first token 0.21 s · hit rate 96.9%")
    assert "31.2 tok/s" in stats_line(STATS)


# A shorter run of backticks inside a longer fence is code, not its end: the closing must match.
@pytest.mark.parametrize(("fence", "code"), [("```", "for i in"), ("~~~", "for i in"), ("````", "```\nfor i in")])
def test_a_reply_stopped_inside_a_code_block_leaves_the_rest_of_the_markdown_as_prose(
        store: ConversationStore, fence: str, code: str) -> None:
    conversation = store.create(title="Stopped")
    question = store.add_message(conversation.id, None, USER, "Write a loop", DONE)
    stopped = store.add_message(conversation.id, question.id, ASSISTANT, f"Sure:\n\n{fence}python\n{code}", STOPPED)
    store.add_message(conversation.id, stopped.id, USER, "Second question", DONE)
    segments = split_fences(render(load_transcripts(store, [conversation.id]), "md"))
    assert [segment.text for segment in segments if segment.code] == [code]
    prose = "".join(segment.text for segment in segments if not segment.code)
    assert "*stopped*" in prose and "### You" in prose and "Second question" in prose


def test_html_is_self_contained_escaped_and_highlights_code(store: ConversationStore, conversation_id: int) -> None:
    html = render(load_transcripts(store, [conversation_id]), "html")
    assert html.startswith("<!DOCTYPE html>") and "<style>" in html and "@media print" in html
    assert "src=" not in html and "<link" not in html
    assert "&lt;ok&gt;" in html and "<ok>" not in html
    assert "<strong>it</strong>" in html and "<code>add(1, 2)</code>" in html
    assert "<pre><code>" in html and 'style="color:' in html  # Pygments inline colours
    assert "You are a terse tutor." in html


def test_plain_text_has_speakers_and_no_markup_added(store: ConversationStore, conversation_id: int) -> None:
    text = render(load_transcripts(store, [conversation_id]), "txt")
    assert text.splitlines()[:2] == ["Adding numbers", "=============="]
    assert "System prompt: You are a terse tutor." in text
    assert "[You, " in text and "[Assistant, " in text and REPLY in text


def test_json_round_trip_recreates_the_conversation_exactly(store: ConversationStore, conversation_id: int) -> None:
    exported = json.loads(render(load_transcripts(store, [conversation_id]), "json"))
    assert exported["version"] == 1 and len(exported["conversations"][0]["messages"]) == 4
    (new_id,) = store_transcripts(store, from_json(json.dumps(exported)))
    assert new_id != conversation_id
    again = json.loads(to_json(load_transcripts(store, [new_id])))
    exported.pop("exported_at"), again.pop("exported_at")
    assert again == exported
    original, copy = store.thread(conversation_id), store.thread(new_id)
    assert [(e.message.content, e.message.stats, e.message.created_at, e.version) for e in copy] == [
        (e.message.content, e.message.stats, e.message.created_at, e.version) for e in original
    ]
    assert store.get(new_id).sampling == store.get(conversation_id).sampling


def test_json_import_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TranscriptError, match="not JSON"):
        from_json("{")
    with pytest.raises(TranscriptError, match="not a SeqMoE Chat transcript"):
        from_json('{"format": "other"}')
    with pytest.raises(TranscriptError, match="newer"):
        from_json('{"format": "seqmoe-chat-transcript", "version": 99, "conversations": []}')
    broken = {"format": "seqmoe-chat-transcript", "version": 1, "conversations": [{"title": "x", "messages": [
        {"id": 1, "parent": 5, "role": "user", "content": "hi", "created_at": "2025-01-01T00:00:00+00:00"}
    ], "created_at": "2025-01-01T00:00:00+00:00", "updated_at": "2025-01-01T00:00:00+00:00"}]}
    with pytest.raises(TranscriptError, match="before its parent"):
        from_json(json.dumps(broken))


def transcript_text(conversation: dict | None = None, message: dict | None = None, version: int = 1) -> str:
    """A file of two conversations: a sound one, then one with ``conversation`` and ``message`` changed."""
    def sound(title: str) -> dict:
        return {"title": title, "sampling": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 512, "seed": None},
                "created_at": "2025-01-01T00:00:00+00:00", "updated_at": "2025-01-01T00:00:00+00:00",
                "current_message": 1, "messages": [{"id": 1, "parent": None, "role": "user", "content": "hi",
                                                   "stats": {}, "created_at": "2025-01-01T00:00:00+00:00"}]}
    changed = {**sound("Changed"), **(conversation or {})}
    changed["messages"] = [{**entry, **(message or {})} for entry in changed["messages"]]
    return json.dumps({"format": "seqmoe-chat-transcript", "version": version, "conversations": [sound("Sound"), changed]})


MALFORMED = {
    "nested deeper than Python recurses": ('{"format": "seqmoe-chat-transcript", "version": 1, "conversations": '
                                           + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "a 5000-digit number": (transcript_text(version=int("1" * 4000)).replace("1" * 4000, "1" * 5000), "too many digits"),
    "an id of 1e400": (transcript_text(message={"id": 7}).replace('"id": 7', '"id": 1e400'), 'message 1: "id" must be a whole'),
    "no sampling object": (transcript_text({"sampling": None}), 'conversation 2: "sampling" must be an object'),
    "a list for sampling": (transcript_text({"sampling": [1]}), '"sampling" must be an object'),
    "a lone surrogate": (transcript_text(message={"content": "\ud800"}), '"content" holds a character that is not valid Unicode'),
    "a time that is no time": (transcript_text(message={"created_at": "yesterday"}), '"created_at" is not a date and time'),
    "statistics in words": (transcript_text(message={"stats": {"tokens": "many"}}), 'stats: "tokens" must be a number'),
    "a speed no float holds": (transcript_text(message={"stats": {"tokens_per_s": 10**400}}), '"tokens_per_s" must be a number'),
    "nested statistics": (transcript_text(message={"stats": {"device": {"a": 1}}}), '"device" must be a number, text'),
    "a NaN temperature": (transcript_text({"sampling": {"temperature": float("nan")}}), '"temperature" must be a number'),
    "a negative top-p": (transcript_text({"sampling": {"top_p": -3}}), '"top_p" must be a number from 0.05 to 1'),
    "negative max new tokens": (transcript_text({"sampling": {"max_new_tokens": -10}}), '"max_new_tokens" must be a whole'),
    "a negative version": (transcript_text(version=-5), "version -5 is not one this app reads"),
    "a null title": (transcript_text({"title": None}), 'conversation 2: "title" must be text'),
    "a message id twice": (transcript_text({"messages": [{"id": 1, "role": "user", "content": "a", "created_at": "2025-01-01"}] * 2}),
                           "two messages have the id 1"),
}


@pytest.mark.parametrize(("text", "reason"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_transcript_is_refused_with_a_one_line_reason_and_nothing_imported(
        store: ConversationStore, text: str, reason: str) -> None:
    with pytest.raises(TranscriptError, match=reason) as refused:
        store_transcripts(store, from_json(text))
    assert "\n" not in str(refused.value)
    assert store.summaries() == []


def test_missing_optional_fields_take_their_defaults(store: ConversationStore) -> None:
    document = json.loads(transcript_text())
    del document["conversations"][1]["sampling"]
    (_, new_id) = store_transcripts(store, from_json(json.dumps(document)))
    assert store.get(new_id).sampling == SamplingSettings()
    assert [(m.state, m.error, m.stats, m.updated_at) for m in store.messages(new_id)] == [
        ("done", "", {}, "2025-01-01T00:00:00+00:00")
    ]


def test_a_file_that_names_no_current_message_shows_its_newest_line(store: ConversationStore) -> None:
    # The chat opened empty, its messages stored but none shown.
    document = json.loads(transcript_text())
    changed = document["conversations"][1]
    del changed["current_message"]
    changed["messages"] += [
        {"id": 2, "parent": 1, "role": "assistant", "content": "first reply", "created_at": "2025-01-01T00:00:00+00:00"},
        {"id": 3, "parent": 1, "role": "assistant", "content": "second reply", "created_at": "2025-01-01T00:00:00+00:00"},
    ]
    (_, new_id) = store_transcripts(store, from_json(json.dumps(document)))
    assert [entry.message.content for entry in store.thread(new_id)] == ["hi", "second reply"]

def test_a_reply_exported_while_it_streamed_is_imported_as_interrupted(store: ConversationStore) -> None:
    document = json.loads(transcript_text())
    document["conversations"][1]["messages"][0]["state"] = "streaming"
    (_, new_id) = store_transcripts(store, from_json(json.dumps(document)))
    assert [m.state for m in store.messages(new_id)] == ["interrupted"]


def test_all_conversations_go_into_one_file(store: ConversationStore, conversation_id: int, tmp_path: Path) -> None:
    other = store.create(title="Second chat")
    store.add_message(other.id, None, USER, "Another question", DONE)
    ids = [s.id for s in store.summaries()]
    for fmt in ("md", "json", "html", "txt"):
        path = tmp_path / f"all.{fmt}"
        write_export(path, load_transcripts(store, ids), fmt)
        text = path.read_text(encoding="utf-8")
        assert "Second chat" in text and "Adding numbers" in text
        assert format_for(path) == fmt
    assert list(tmp_path.glob(".*.tmp")) == []


def test_an_export_to_a_name_near_the_file_systems_limit_is_written(
        store: ConversationStore, conversation_id: int, tmp_path: Path) -> None:
    path = tmp_path / ("a" * 245 + ".md")  # 248 bytes: a name any file system takes
    write_export(path, load_transcripts(store, [conversation_id]), "md")
    assert path.read_text(encoding="utf-8").startswith("# Adding numbers")
    assert list(tmp_path.glob(".*.tmp")) == []


def test_an_export_takes_the_format_its_typed_name_asks_for(tmp_path: Path) -> None:
    assert export_target(tmp_path / "notes.json", "md") == (tmp_path / "notes.json", "json")
    assert export_target(tmp_path / "notes.HTM", "txt") == (tmp_path / "notes.HTM", "html")
    assert export_target(tmp_path / "notes", "html") == (tmp_path / "notes.html", "html")
    # A dot in a name is not an extension of an export format: the chosen format, the name kept.
    assert export_target(tmp_path / "chat v2.5", "md") == (tmp_path / "chat v2.5", "md")


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_an_export_is_readable_as_any_saved_file_and_keeps_a_replaced_files_mode(
        store: ConversationStore, conversation_id: int, tmp_path: Path) -> None:
    transcripts = load_transcripts(store, [conversation_id])
    old_umask = os.umask(0o022)
    try:
        write_export(tmp_path / "new.md", transcripts, "md")
        existing = tmp_path / "existing.md"
        existing.write_text("old")
        existing.chmod(0o640)
        write_export(existing, transcripts, "md")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "new.md").stat().st_mode) == 0o644
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640 and "Adding numbers" in existing.read_text()


def test_code_fences_are_found_like_commonmark() -> None:
    text = "intro\n~~~~ js extra\nlet a = 1;\n```\nstill code\n~~~~\nmiddle\n```\nunclosed"
    segments = split_fences(text)
    assert [(s.code, s.closed) for s in segments] == [(False, True), (True, True), (False, True), (True, False)]
    assert segments[1].language == "js" and segments[1].text == "let a = 1;\n```\nstill code"
    assert "".join(s.source for s in segments) == text
    assert [b.text for b in code_blocks(text)] == ["let a = 1;\n```\nstill code"]


def test_copy_code_of_a_block_in_a_list_item_leaves_the_items_indentation() -> None:
    # The chat shows the block without it; copied with it, Python code did not compile.
    text = "1. Save this as `f.py`:\n   ```python\n   def f():\n       return 1\n  x\n\n   ```\n2. Run it.\n"
    assert [b.text for b in code_blocks(text)] == ["def f():\n    return 1\nx\n"]
