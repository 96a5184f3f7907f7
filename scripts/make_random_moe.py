"""Writes a random-weight MoE with the layer shape of OLMoE-1B-7B (bf16), for speed checks.

Routing of random weights is near uniform, so it is a worst case for any cache; it says
how fast copies and compute are, not how well a policy predicts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, OlmoeConfig, PreTrainedTokenizerFast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    if (args.out / "config.json").exists():
        return
    config = OlmoeConfig(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
        eos_token_id=1, pad_token_id=0, dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(args.out)
    vocab = {f"<{i}>": i for i in range(256)} | {chr(i): i for i in range(32, 127)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<1>", unk_token="<0>", pad_token="<0>").save_pretrained(args.out)


if __name__ == "__main__":
    main()
