"""The text a user sees of a reply: all of it for most models; for gpt-oss's harmony format only
the final channel, the analysis kept apart as the reasoning, while streaming and once whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from seqmoe import Engine, Sampling, load_model
from seqmoe.cli import main
from seqmoe.reply_text import ReplyText

from .harmony import ANALYSIS, ANSWER, QUESTION, REPLY, build_harmony_model, harmony_tokenizer, token_ids


def streamed(reply: ReplyText, ids: list[int]) -> list[str]:
    """The text shown after each of ``ids`` arrived."""
    texts = []
    for token_id in ids:
        reply.add(token_id)
        texts.append(reply.text())
    return texts


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A token a byte: a character of two bytes arrives in two tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE({char: i for i, char in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def test_a_plain_reply_is_its_decoded_tokens_holding_back_a_half_arrived_character() -> None:
    tokenizer = byte_tokenizer()
    ids = tokenizer("café au lait")["input_ids"] + [tokenizer.eos_token_id]
    reply = ReplyText(tokenizer)
    texts = streamed(reply, ids)
    assert texts[:5] == ["c", "ca", "caf", "caf", "café"]  # é is two bytes: no U+FFFD between them
    assert texts[-1] == "café au lait" == tokenizer.decode(ids, skip_special_tokens=True)
    assert reply.reasoning() == "" and reply.count == len(ids)


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_harmony_model(tmp_path_factory.mktemp("models") / "tiny-gpt-oss")


@pytest.fixture(scope="module")
def engine(harmony_model: Path) -> Iterator[Engine]:
    made = Engine(load_model(str(harmony_model), device="cpu"))
    made.configure("lru", cache_ratio=0.5)
    yield made
    made.close()


def test_a_harmony_reply_is_its_final_answer_and_its_analysis_the_reasoning(engine: Engine) -> None:
    tokenizer = engine.loaded.tokenizer
    shown: list[str] = []
    stream = ReplyText(tokenizer)

    def on_token(token_id: int) -> None:
        stream.add(token_id)
        shown.append(stream.text())

    prompt = engine.encode_messages([{"role": "user", "content": QUESTION}])
    result = engine.generate(prompt, Sampling(max_new_tokens=40), on_token=on_token)
    assert result.token_ids == token_ids(tokenizer, REPLY)  # the model was steered as meant
    assert (result.text, result.reasoning) == (ANSWER, ANALYSIS)
    # Nothing until the final channel opens, then the answer word by word.
    answer_starts = REPLY.split().index("final") + 2
    assert shown == [""] * answer_starts + ["Hello", ANSWER, ANSWER]
    # The next turn's history holds the answer alone, none of the reasoning or the channel names.
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": result.text},
               {"role": "user", "content": "Hi"}]
    assert "<|message|> Hello there <|end|>" in tokenizer.decode(engine.encode_messages(history))
    assert not {"analysis", "greets", "final"} & set(tokenizer.decode(engine.encode_messages(history)).split())


def test_a_harmony_reply_cut_off_in_its_analysis_has_no_answer(engine: Engine) -> None:
    prompt = engine.encode_messages([{"role": "user", "content": QUESTION}])
    result = engine.generate(prompt, Sampling(max_new_tokens=5))
    assert (result.text, result.reasoning) == ("", "The user")


def test_seqmoe_generate_prints_only_the_answer_and_its_json_the_reasoning_apart(
    harmony_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["generate", "--model", str(harmony_model), "--device", "cpu", "--policy", "lru", "--chat",
               "--prompt", QUESTION, "--max-new-tokens", "40"]
    assert main(command) == 0 and capsys.readouterr().out == f"{ANSWER}\n"
    assert main([*command, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["text"], payload["reasoning"]) == (ANSWER, ANALYSIS)


@pytest.mark.parametrize(("tokens", "text", "reasoning"), [
    # A preamble on the commentary channel before the answer, and a tool call with a recipient
    # and a content type in its header: neither is the answer.
    ("<|channel|> commentary <|message|> I wave <|end|> <|start|> assistant <|channel|> final <|message|> Hello "
     "<|return|>", "Hello", ""),
    ("<|channel|> analysis <|message|> The user <|end|> <|start|> assistant <|channel|> commentary to=functions.wave "
     "<|constrain|> json <|message|> {} <|call|>", "", "The user"),
    # Two messages on one channel are two paragraphs: decoded as one, a byte-level tokenizer ran
    # the end of the first into the second.
    ("<|channel|> analysis <|message|> The user <|end|> <|start|> assistant <|channel|> analysis <|message|> greets "
     "me <|end|> <|start|> assistant <|channel|> final <|message|> Hello <|return|>", "Hello", "The user\n\ngreets me"),
    # Plain text, though the tokenizer knows harmony: a prompt continued as text, not as a chat.
    ("Hello there <|return|>", "Hello there", ""),
])
def test_only_the_final_channel_of_a_harmony_reply_is_the_answer(tokens: str, text: str, reasoning: str) -> None:
    tokenizer = harmony_tokenizer()
    reply = ReplyText.of(tokenizer, token_ids(tokenizer, tokens))
    assert (reply.text(), reply.reasoning()) == (text, reasoning)
