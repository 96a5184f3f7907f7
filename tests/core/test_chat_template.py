"""Conversations through a model's chat template: a template without a system role, and the
template's own refusals, which reach the user in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from seqmoe import Engine, SeqMoEError, load_model
from seqmoe.cli import main
from seqmoe.errors import ModelRefused

from .conftest import CHAT_TEMPLATE, CHAT_TEXT, without_chat_template

NO_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
ALTERNATING = (
    "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}"
)
SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def engine(mixtral_dir: Path) -> Iterator[Engine]:
    made = Engine(load_model(str(mixtral_dir), device="cpu"))
    yield made
    made.close()


def ids_with(engine: Engine, template: str | None, messages: list[dict[str, str]]) -> list[int]:
    tokenizer = engine.loaded.tokenizer
    shipped = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        return engine.encode_messages(messages)
    finally:
        tokenizer.chat_template = shipped


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_without_a_system_role_the_system_prompt_heads_the_first_user_turn(engine: Engine) -> None:
    talk = [turn("user", "Hi"), turn("assistant", "Hello"), turn("user", "Why?")]
    folded = ids_with(engine, NO_SYSTEM + CHAT_TEMPLATE, [SYSTEM, *talk])
    assert folded == ids_with(engine, CHAT_TEMPLATE, [turn("user", "Be brief.\n\nHi"), *talk[1:]])
    # A template that has the role keeps the system message as it is.
    assert ids_with(engine, CHAT_TEMPLATE, [SYSTEM, *talk]) != folded


def test_the_templates_own_refusal_is_the_message(engine: Engine) -> None:
    with pytest.raises(SeqMoEError, match="rejected the conversation: Conversation roles must alternate"):
        ids_with(engine, ALTERNATING + CHAT_TEMPLATE, [turn("user", "Hi"), turn("user", "Again")])
    # Folding the system prompt in does not mend this one: the refusal still names what is wrong.
    with pytest.raises(SeqMoEError, match="Conversation roles must alternate"):
        ids_with(engine, NO_SYSTEM + ALTERNATING + CHAT_TEMPLATE, [SYSTEM, turn("user", "Hi"), turn("user", "Again")])


def test_a_model_without_a_chat_template_asks_for_a_plain_prompt(engine: Engine) -> None:
    with pytest.raises(SeqMoEError, match="has no chat template; use a plain prompt"):
        ids_with(engine, None, [turn("user", "Hi")])


@pytest.mark.parametrize("command", [["trace", "--out", "{out}", "--text", "{text}"], ["eval-predictor", "--text", "{text}"],
                                     ["generate", "--prompt", "hi"]])
def test_chat_text_for_a_model_without_a_chat_template_is_refused_in_one_line(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    model = without_chat_template(mixtral_dir, tmp_path / "plain")
    text = tmp_path / "chat.txt"
    text.write_text(CHAT_TEXT)
    out = tmp_path / "traces"
    command = [flag.format(out=out, text=text) for flag in command]
    status = main([*command, "--model", str(model), "--device", "cpu", "--chat"])
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: plain has no chat template; drop --chat to send the text as plain text\n")
    assert not out.exists()


def test_a_model_in_the_hugging_face_cache_is_named_by_its_repository(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # How `--model owner/name` finds it once downloaded: the folder's own name is the commit.
    snapshot = tmp_path / "hub" / "models--acme--tiny-moe" / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    model = without_chat_template(mixtral_dir, snapshot)
    status = main(["generate", "--prompt", "hi", "--model", str(model), "--device", "cpu", "--chat"])
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: acme/tiny-moe has no chat template; drop --chat to send the text as plain text\n")


def test_a_model_without_a_chat_template_is_refused_for_chat_before_the_model_loaded_before_goes(
    mixtral_dir: Path, tmp_path: Path
) -> None:
    # A chat app loaded it, let the model before go, and then failed every message sent to it.
    model = without_chat_template(mixtral_dir, tmp_path / "plain")
    released = []
    with pytest.raises(ModelRefused, match="plain has no chat template: it is not made for chat"):
        load_model(str(model), device="cpu", on_checked=lambda: released.append(True), for_chat=True)
    assert not released
    assert not load_model(str(model), device="cpu").has_chat_template  # plain text still has it
