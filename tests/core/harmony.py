"""A tiny gpt-oss that answers in OpenAI's harmony format, as openai/gpt-oss-20b does: its
tokenizer has harmony's special tokens, and its generation config steers it (``sequence_bias``)
to reply to ``QUESTION`` with an analysis, then a final answer."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast

from .conftest import FAMILIES, build_model

QUESTION = "Hi"
ANALYSIS = "The user greets me"
ANSWER = "Hello there"
# As gpt-oss's chat template writes the reply: its generation prompt ends with <|start|>assistant.
REPLY = (f"<|channel|> analysis <|message|> {ANALYSIS} <|end|> "
         f"<|start|> assistant <|channel|> final <|message|> {ANSWER} <|return|>")

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
WORDS = ["<unk>", "<pad>", "analysis", "final", "commentary", "assistant", "user", "Hi", "The", "greets", "me",
         "Hello", "there", "I", "wave", "to=functions.wave", "json", "{}"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def harmony_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer: a token a word, decoded with spaces between them."""
    vocab = {token: token_id for token_id, token in enumerate(WORDS + MARKERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<|return|>", additional_special_tokens=MARKERS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def token_ids(tokenizer: PreTrainedTokenizerFast, tokens: str) -> list[int]:
    """The ids of the space-separated ``tokens``."""
    return tokenizer.convert_tokens_to_ids(tokens.split())


def build_harmony_model(folder: Path) -> Path:
    build_model(folder, FAMILIES["gpt_oss"])
    tokenizer = harmony_tokenizer()
    tokenizer.save_pretrained(folder)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    sequence = list(prompt) + token_ids(tokenizer, REPLY)
    config = GenerationConfig.from_pretrained(folder)
    # Each reply token after the seven before it: the markers recur, seven tokens tell them apart.
    config.sequence_bias = [[sequence[i - 7 : i + 1], 100.0] for i in range(len(prompt), len(sequence))]
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|return|>")
    config.save_pretrained(folder)
    return folder
