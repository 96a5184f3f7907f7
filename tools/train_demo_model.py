#!/usr/bin/env python3
"""Train the small "seqmoe-demo" Mixture-of-Experts chat model on CPU.

Pipeline: read Synthetic-Persona-Chat, split it by conversation, train a byte-level
BPE tokenizer, train a Qwen3-MoE model (every decoder layer an MoE layer) with the
router load-balancing loss, export it in bf16 as a standard transformers folder, then
reload the exported folder and evaluate it (validation perplexity, unigram baseline,
expert usage, greedy sample conversations). The results go into
``training_report.json`` and the model card ``README.md`` next to the weights.

Training is resumable: a checkpoint is written to ``--work-dir`` every few minutes and
``--resume`` continues from it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Sleeping instead of spinning at OpenMP barriers: on a 2-core machine that also runs other
# work, spinning threads steal the cores from their own stragglers (measured 2-3x slower).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (must follow the OpenMP setting)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS_NAME = "synthetic-persona-chat"
PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TURN_LINE = re.compile(r"^[\s*]*User (?P<speaker>[12]):[\s*]*(?P<text>.*?)(?:\s+\*+)?\s*$")
MAX_DISK_BYTES = 25_000_000
MIN_EXPERT_SHARE = 0.70
MIN_MOE_LAYERS, MIN_EXPERTS, MIN_TOP_K = 6, 16, 2
MIN_USAGE_SHARE = 0.01
SAMPLE_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi! How are you today?"}],
    [{"role": "user", "content": "What do you like to do for fun?"}],
    [
        {"role": "system", "content": "I love to bake cookies.\nI have two dogs.\nKnitting is my passion."},
        {"role": "user", "content": "Do you have any pets?"},
    ],
    [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! How are you?"},
        {"role": "user", "content": "I'm good, I just got back from a hike in the mountains."},
    ],
]
Messages = list[dict[str, str]]
TokenCounter = Callable[[dict[str, str]], int]  # tokens of one rendered message


@dataclass(frozen=True)
class Conversation:
    personas: tuple[str, str]  # persona sentences of User 1 and User 2, newline-separated
    turns: tuple[tuple[int, str], ...]  # (speaker 0 or 1, text)


# ----------------------------------------------------------------------------- data


def load_conversations(data_dir: Path) -> list[Conversation]:
    """Read every CSV of the corpus; keep the conversations with at least two turns."""
    files = sorted((data_dir / CORPUS_NAME).glob("*.csv"))
    if not files:
        raise SystemExit(f"no CSV files in {data_dir / CORPUS_NAME}")
    conversations = []
    for path in files:
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                turns = parse_turns(row["Best Generated Conversation"])
                if len(turns) >= 2:
                    personas = (row["user 1 personas"].strip(), row["user 2 personas"].strip())
                    conversations.append(Conversation(personas, tuple(turns)))
    return conversations


def parse_turns(text: str) -> list[tuple[int, str]]:
    """Parse 'User 1: ...' / 'User 2: ...' lines (some are wrapped in markdown asterisks),
    merging consecutive lines of one speaker; other lines (stage directions) are dropped."""
    turns: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = TURN_LINE.match(line)
        if not match or not match["text"]:
            continue
        speaker, content = int(match["speaker"]) - 1, match["text"]
        if turns and turns[-1][0] == speaker:
            turns[-1] = (speaker, f"{turns[-1][1]} {content}")
        else:
            turns.append((speaker, content))
    return turns


def split_by_conversation(
    conversations: list[Conversation], val_fraction: float, seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(order) * val_fraction))
    val_ids = set(order[:n_val])
    train = [c for i, c in enumerate(conversations) if i not in val_ids]
    val = [c for i, c in enumerate(conversations) if i in val_ids]
    return train, val


def chat_segments(
    conversation: Conversation, assistant: int, with_persona: bool, count_tokens: TokenCounter, max_tokens: int
) -> list[Messages]:
    """Render one conversation as chats where speaker ``assistant`` plays the assistant.

    The chat starts at the first turn of the other speaker (the user). Long conversations
    are split at user turns into several chats of at most ``max_tokens`` tokens where
    possible; each chat repeats the system message (the assistant's persona) when
    ``with_persona``.
    """
    turns = list(conversation.turns)
    while turns and turns[0][0] == assistant:
        turns.pop(0)
    exchanges: list[Messages] = []  # a user message and the assistant reply that follows it
    for speaker, text in turns:
        role = "assistant" if speaker == assistant else "user"
        if role == "user":
            exchanges.append([])
        exchanges[-1].append({"role": role, "content": text})
    system = [{"role": "system", "content": conversation.personas[assistant]}] if with_persona else []
    system_tokens = sum(map(count_tokens, system))
    segments: list[Messages] = []
    current, size = list(system), system_tokens
    for exchange in exchanges:
        cost = sum(map(count_tokens, exchange))
        if len(current) > len(system) and size + cost > max_tokens:
            segments.append(current)
            current, size = list(system), system_tokens
        current += exchange
        size += cost
    if len(current) > len(system):
        segments.append(current)
    return segments


def training_chats(
    conversations: list[Conversation], seed: int, count_tokens: TokenCounter, max_tokens: int
) -> list[Messages]:
    """Both role mappings of every conversation; half of them with the persona system message."""
    rng = random.Random(seed)
    chats = []
    for conversation in conversations:
        for assistant in (1, 0):
            with_persona = rng.random() < 0.5
            chats += chat_segments(conversation, assistant, with_persona, count_tokens, max_tokens)
    return chats


def validation_chats(conversations: list[Conversation], count_tokens: TokenCounter, max_tokens: int) -> list[Messages]:
    """User 1 as user, User 2 as assistant, with the assistant's persona as system message."""
    chats = []
    for conversation in conversations:
        chats += chat_segments(conversation, 1, True, count_tokens, max_tokens)
    return chats


# ------------------------------------------------------------------------ tokenizer


def train_tokenizer(conversations: list[Conversation], vocab_size: int) -> PreTrainedTokenizerFast:
    texts: list[str] = []
    for conversation in conversations:
        texts += conversation.personas
        texts += [text for _, text in conversation.turns]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def check_tokenizer(tok: PreTrainedTokenizerFast) -> None:
    sample = "Hi! I'm fine, thanks -- you? It's 5 o'clock; \"quotes\" & tabs\tand  double  spaces.\n"
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    if tok.decode(ids) != sample:
        raise SystemExit(f"tokenizer does not round-trip: {tok.decode(ids)!r}")
    prompt = tok.apply_chat_template(SAMPLE_PROMPTS[2], add_generation_prompt=True, tokenize=False)
    if not prompt.endswith(f"{IM_START}assistant\n") or tok.convert_tokens_to_ids(IM_END) != tok.eos_token_id:
        raise SystemExit(f"unexpected chat template output: {prompt!r}")


def encode_chat(tok: PreTrainedTokenizerFast, messages: Messages) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------- model


def build_model(tok: PreTrainedTokenizerFast, args: argparse.Namespace) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden_size,
        intermediate_size=args.moe_intermediate_size,  # unused: every layer is an MoE layer
        moe_intermediate_size=args.moe_intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        router_aux_loss_coef=args.aux_loss_coef,  # documents training; the loop computes its own loss
        output_router_logits=False,
        sliding_window=None,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    return Qwen3MoeForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def parameter_split(model: Qwen3MoeForCausalLM) -> dict[str, int | float]:
    total = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    return {
        "total": total,
        "routed_experts": experts,
        "routed_expert_share": experts / total,
        "bf16_bytes": 2 * total,
    }


def check_constraints(model: Qwen3MoeForCausalLM) -> dict[str, int | float]:
    config = model.config
    split = parameter_split(model)
    moe_layers = sum(hasattr(layer.mlp, "experts") for layer in model.model.layers)
    problems = [
        msg
        for failed, msg in [
            (split["bf16_bytes"] > MAX_DISK_BYTES, f"bf16 weights take {split['bf16_bytes']:,} bytes"),
            (split["routed_expert_share"] < MIN_EXPERT_SHARE, f"expert share {split['routed_expert_share']:.3f}"),
            (moe_layers < MIN_MOE_LAYERS or moe_layers != config.num_hidden_layers, f"{moe_layers} MoE layers"),
            (config.num_experts < MIN_EXPERTS, f"{config.num_experts} experts"),
            (config.num_experts_per_tok < MIN_TOP_K, f"top-k {config.num_experts_per_tok}"),
        ]
        if failed
    ]
    if problems:
        raise SystemExit("model violates the size constraints: " + "; ".join(problems))
    return split


# ------------------------------------------------------------------------- batching


def length_bucketed_batches(
    lengths: list[int], token_budget: int, epoch: int, seed: int
) -> list[list[int]]:
    """Shuffle, sort within pools of similar length, and pack into batches of at most
    ``token_budget`` padded tokens; the batch order is shuffled again. Deterministic."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    pool_size = 256
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: lengths[i])
        batch: list[int] = []
        for index in pool:
            if batch and (len(batch) + 1) * lengths[index] > token_budget:  # pool is sorted by length
                batches.append(batch)
                batch = []
            batch.append(index)
        batches.append(batch)
    rng.shuffle(batches)
    return batches


def collate(sequences: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def batch_stream(
    sequences: list[list[int]], token_budget: int, seed: int, epoch: int, index: int
) -> Iterator[tuple[int, int, list[list[int]]]]:
    """Yield (epoch, index within epoch, batch) forever, starting at (epoch, index)."""
    lengths = [len(s) for s in sequences]
    while True:
        batches = length_bucketed_batches(lengths, token_budget, epoch, seed)
        for position in range(index, len(batches)):
            yield epoch, position, [sequences[i] for i in batches[position]]
        epoch, index = epoch + 1, 0


# ------------------------------------------------------------------------- training


def lr_factor(step: int, progress: float, warmup_steps: int, warmup_fraction: float, floor: float = 0.1) -> float:
    """Linear warmup over the first steps, then cosine decay to ``floor`` times the peak
    learning rate as ``progress`` goes from ``warmup_fraction`` to 1."""
    warm = min(1.0, (step + 1) / warmup_steps)
    decay = min(1.0, max(0.0, (progress - warmup_fraction) / (1 - warmup_fraction)))
    return warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * decay)))


def training_progress(step: int, seconds: float, args: argparse.Namespace) -> float:
    """The larger of the step fraction and the time fraction. When the machine finishes
    ``--steps`` within ``--max-minutes`` (the intended case) the schedule depends on the
    step alone and the run is reproducible; on a slower or busy machine the whole schedule,
    decay included, is compressed into ``--max-minutes`` instead of being cut off."""
    return max(step / args.steps, seconds / (60 * args.max_minutes))


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
    )


def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...], attention_mask: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, float]:
    """Switch-Transformer balance loss E * sum_i f_i * P_i computed per layer and averaged
    (2.0 = perfectly balanced top-2 routing), and the smallest per-layer expert share in the
    batch. Per layer on purpose: the transformers helper pools the layers first, so one
    layer's expert i may starve as long as expert i is busy in another layer."""
    real = attention_mask.reshape(-1).bool()
    losses, min_share = [], 1.0
    for logits in router_logits:
        probs = logits[real].float().softmax(dim=-1)
        n_tokens, n_experts = probs.shape
        chosen = probs.topk(top_k, dim=-1).indices.reshape(-1)
        assigned = torch.bincount(chosen, minlength=n_experts).float() / n_tokens  # sums to top_k
        losses.append(n_experts * (assigned * probs.mean(dim=0)).sum())
        min_share = min(min_share, float(assigned.min()) / top_k)
    return torch.stack(losses).mean(), min_share


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    model: Qwen3MoeForCausalLM,
    sequences: list[list[int]],
    pad_id: int,
    args: argparse.Namespace,
    command: str,
) -> dict:
    """Run (or resume) the training loop; returns the bookkeeping state of the final step."""
    optimizer = make_optimizer(model, args)
    warmup_steps = max(1, int(args.warmup_fraction * args.steps))
    checkpoint_path = args.work_dir / "checkpoint.pt"
    state = {"step": 0, "epoch": 0, "batch_index": 0, "train_seconds": 0.0, "tokens": 0, "commands": [], "log": []}
    if args.resume and checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["python_rng"])
        state = saved["state"]  # step and training time also determine the LR schedule
        print(f"resumed from step {state['step']}", flush=True)
    state["commands"].append(command)

    stream = batch_stream(sequences, args.batch_tokens, args.seed, state["epoch"], state["batch_index"])
    model.train()
    started = time.monotonic() - state["train_seconds"]
    last_save = time.monotonic()
    bar = tqdm(total=args.steps, initial=state["step"], desc="train", dynamic_ncols=True, mininterval=5)
    while (progress := training_progress(state["step"], state["train_seconds"], args)) < 1:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(state["step"], progress, warmup_steps, args.warmup_fraction)
        epoch, index, batch = next(stream)
        inputs = collate(batch, pad_id)
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_router_logits=True)
        lm_loss = causal_lm_loss(out.logits, inputs["labels"])
        balance_loss, min_share = load_balancing_loss(out.router_logits, inputs["attention_mask"], args.top_k)
        (lm_loss + args.aux_loss_coef * balance_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        state.update(step=state["step"] + 1, epoch=epoch, batch_index=index + 1)
        state["tokens"] += int(inputs["attention_mask"].sum())
        state["train_seconds"] = time.monotonic() - started
        state["log"].append(
            {
                "step": state["step"],
                "lm_loss": round(lm_loss.item(), 4),
                "balance_loss": round(balance_loss.item(), 4),
                "min_expert_share": round(min_share, 5),
            }
        )
        bar.update(1)
        bar.set_postfix(
            loss=f"{lm_loss.item():.3f}",
            balance=f"{balance_loss.item():.3f}",
            min_share=f"{min_share:.3f}",
            lr=f"{optimizer.param_groups[0]['lr']:.1e}",
        )
        finished = training_progress(state["step"], state["train_seconds"], args) >= 1
        if finished or time.monotonic() - last_save > args.checkpoint_minutes * 60:
            save_checkpoint(
                checkpoint_path,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "python_rng": random.getstate(),
                    "state": state,
                },
            )
            last_save = time.monotonic()
    bar.close()
    if state["step"] < args.steps:
        print(f"schedule compressed into --max-minutes: {state['step']} of {args.steps} steps", flush=True)
    return state


# ----------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model: Qwen3MoeForCausalLM, sequences: list[list[int]], unigram_logprobs: torch.Tensor, batch_tokens: int
) -> dict:
    """Per-token validation loss of the model and of the unigram baseline, plus expert usage."""
    model.eval()
    config = model.config
    counts = torch.zeros(config.num_hidden_layers, config.num_experts, dtype=torch.float64)
    nll_sum, unigram_nll_sum, n_targets = 0.0, 0.0, 0
    for batch in length_bucketed_batches([len(s) for s in sequences], batch_tokens, 0, 0):
        inputs = collate([sequences[i] for i in batch], config.pad_token_id)
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_router_logits=True)
        targets = inputs["labels"][:, 1:]
        mask = targets != -100
        logprobs = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
        nll_sum -= logprobs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask].sum().item()
        unigram_nll_sum -= unigram_logprobs[targets[mask]].sum().item()
        n_targets += int(mask.sum())
        real = inputs["attention_mask"].reshape(-1).bool()
        for layer, logits in enumerate(out.router_logits):
            chosen = logits[real].topk(config.num_experts_per_tok, dim=-1).indices.reshape(-1)
            counts[layer] += torch.bincount(chosen, minlength=config.num_experts).double()
    shares = counts / counts.sum(dim=1, keepdim=True)
    entropy = -(shares * torch.log2(shares.clamp(min=1e-12))).sum(dim=1)
    val_loss, unigram_loss = nll_sum / n_targets, unigram_nll_sum / n_targets
    return {
        "validation_tokens": n_targets,
        "val_loss": val_loss,
        "val_perplexity": math.exp(val_loss),
        "unigram_loss": unigram_loss,
        "unigram_perplexity": math.exp(unigram_loss),
        "routing": [
            {
                "layer": layer,
                "entropy_bits": float(entropy[layer]),
                "max_entropy_bits": math.log2(config.num_experts),
                "min_expert_share": float(shares[layer].min()),
                "max_expert_share": float(shares[layer].max()),
            }
            for layer in range(config.num_hidden_layers)
        ],
    }


def unigram_log_probs(sequences: list[list[int]], vocab_size: int) -> torch.Tensor:
    """Add-one smoothed token log-frequencies over the training sequences."""
    counts = torch.ones(vocab_size, dtype=torch.float64)
    for sequence in sequences:
        counts += torch.bincount(torch.tensor(sequence), minlength=vocab_size).double()
    return torch.log(counts / counts.sum())


@torch.no_grad()
def sample_conversations(model: Qwen3MoeForCausalLM, tok: PreTrainedTokenizerFast) -> list[dict]:
    samples = []
    for messages in SAMPLE_PROMPTS:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = tok(prompt, add_special_tokens=False, return_tensors="pt")
        output = model.generate(**inputs, max_new_tokens=40, do_sample=False)
        new_tokens = output[0, inputs["input_ids"].shape[1] :]
        samples.append(
            {
                "messages": messages,
                "reply": tok.decode(new_tokens, skip_special_tokens=True).strip(),
                "stopped_at_im_end": bool((new_tokens == tok.eos_token_id).any()),
            }
        )
    return samples


# --------------------------------------------------------------------------- export


def export(model: Qwen3MoeForCausalLM, tok: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        do_sample=False,
        max_new_tokens=64,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model.to(torch.bfloat16).save_pretrained(out_dir)
    save_tokenizer(tok, out_dir)


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save with the chat template inside tokenizer_config.json, under the class name that
    both transformers 4 and 5 resolve (in 5, PreTrainedTokenizerFast is TokenizersBackend)."""
    tok.save_pretrained(out_dir, save_jinja_files=False)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def load_exported(out_dir: Path) -> tuple[Qwen3MoeForCausalLM, PreTrainedTokenizerFast]:
    """Reload the shipped folder (no remote code) and fail on missing or unexpected keys."""
    model, info = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, output_loading_info=True)
    bad = {key: value for key, value in info.items() if value}
    if bad:
        raise SystemExit(f"exported model does not load cleanly: {bad}")
    config = json.loads((out_dir / "config.json").read_text())
    if "auto_map" in config or config.get("eos_token_id") != model.config.eos_token_id:
        raise SystemExit("config.json has an auto_map or a wrong eos_token_id")
    return model, AutoTokenizer.from_pretrained(out_dir)


def model_card(report: dict) -> str:
    arch, params, ev = report["architecture"], report["parameters"], report["evaluation"]
    routing_rows = "\n".join(
        f"| {r['layer']} | {r['entropy_bits']:.3f} | {r['max_entropy_bits']:.3f} | "
        f"{100 * r['min_expert_share']:.2f}% | {100 * r['max_expert_share']:.2f}% |"
        for r in ev["routing"]
    )
    samples = "\n\n".join(format_sample(s) for s in report["samples"])
    commands = "\n".join(report["training"]["commands"])
    total_note = " (last run only; training was resumed)" if len(report["training"]["commands"]) > 1 else ""
    schedule_note = (
        ""
        if report["training"]["steps_done"] >= report["training"]["steps"]
        else f"\nThis run did not reach the planned {report['training']['steps']} steps within the training-time limit"
        " (`--max-minutes`), so the learning-rate schedule, which follows the larger of the step and time"
        " fractions, was compressed into that limit. A rerun repeats the same training only when the step"
        " budget, not the time limit, ends it."
    )
    t = report["training"]
    return f"""---
license: cc-by-4.0
library_name: transformers
pipeline_tag: text-generation
tags: [qwen3_moe, mixture-of-experts, chat, tiny, demo]
---

# seqmoe-demo

A deliberately tiny Mixture-of-Experts chat model for demonstrating and testing the SeqMoE
expert-offloading engine and chat app. It is a standard `Qwen3MoeForCausalLM` (no remote code)
trained from scratch on a 2-core CPU. It produces short persona-chat style small talk;
it has no world knowledge, often contradicts itself, and is not meant for any real use.

## Data and licence

Trained on the validation and test splits of **Synthetic-Persona-Chat** (Google Research),
by Jandaghi, Sheng, Bai, Pujara and Sidahmed, "Faithful Persona-based Conversational Dataset
Generation with Large Language Models", [arXiv:2312.10007](https://arxiv.org/abs/2312.10007) (2023),
licensed under [CC BY 4.0](https://creativecommons.org/licenses/by/4.0/). The model is trained
on that data and is shared under the same licence. Changes to the data: the conversations were
parsed into turns (markdown asterisks around `User N:` removed, other lines such as stage
directions dropped, consecutive lines of one speaker merged); the corpus is not redistributed here.
No other data (in particular no plain-text corpus) was used.

- {report['data']['conversations']} conversations with at least two turns; {report['data']['validation_conversations']} of them
  ({100 * report['data']['validation_fraction']:.0f}%, chosen with seed {report['seed']}) are held out for validation.
- Chat format (ChatML-like): `<|im_start|>role\\n...<|im_end|>\\n`. In training every conversation is
  used twice, once with User 2 and once with User 1 as the assistant (the other speaker is the user,
  and the chat starts at the user's first turn); half of these chats, chosen at random, start with a
  `system` message holding the assistant's persona sentences. Conversations longer than
  {t['max_sequence_tokens']} tokens are split at user turns.
- The loss is computed on all tokens (user, assistant and system), not only on assistant tokens.

## Architecture

| | |
| --- | --- |
| class | `Qwen3MoeForCausalLM` (`model_type: qwen3_moe`) |
| layers | {arch['layers']}, every one an MoE layer |
| experts per layer | {arch['experts']} routed, top-{arch['top_k']} (normalised top-k weights), no shared expert |
| hidden size / expert FFN size | {arch['hidden_size']} / {arch['moe_intermediate_size']} |
| attention | {arch['attention_heads']} query heads, {arch['kv_heads']} KV heads, head dim {arch['head_dim']} |
| vocabulary | {arch['vocab_size']} (byte-level BPE), tied input/output embeddings |
| context | {arch['max_position_embeddings']} positions |
| parameters, total | {params['total']:,} |
| parameters in routed experts | {params['routed_experts']:,} ({100 * params['routed_expert_share']:.1f}% of all) |
| `model.safetensors` (bf16) | {params['safetensors_bytes']:,} bytes |

## Training

```
{commands}
```

AdamW (peak learning rate {t['lr']}, betas 0.9/0.95, weight decay {t['weight_decay']}), linear warmup then
cosine decay to 10% of the peak, {t['steps_done']} steps of at most {t['batch_tokens']} padded tokens
({t['tokens_seen']:,} real tokens, about {t['epochs_seen']:.1f} passes over the training chats),
float32, seed {report['seed']}, router load-balancing loss (Switch Transformer form, computed per layer
and averaged over the layers) with coefficient {t['aux_loss_coef']}.
Measured on a 2-core CPU: training {t['train_seconds'] / 60:.1f} min; the whole script
(data, tokenizer, training, export, evaluation) {report['total_seconds'] / 60:.1f} min{total_note}.
Final training loss (LM part, last 50 steps): {t['final_train_loss']:.3f}.{schedule_note}

## Evaluation

Measured on the shipped bf16 weights (computed in float32) over the
{report['data']['validation_conversations']} held-out conversations, rendered with the chat template
(User 1 as user, User 2 as assistant, persona as system message):
{ev['validation_tokens']:,} predicted tokens.

| model | loss (nats/token) | perplexity |
| --- | ---: | ---: |
| seqmoe-demo | {ev['val_loss']:.3f} | {ev['val_perplexity']:.2f} |
| unigram baseline (training-split token frequencies, add-one smoothing) | {ev['unigram_loss']:.3f} | {ev['unigram_perplexity']:.2f} |

Expert usage on the validation tokens (share of the top-{arch['top_k']} routing assignments):

| layer | entropy (bits) | max possible (bits) | least-used expert | most-used expert |
| ---: | ---: | ---: | ---: | ---: |
{routing_rows}

## Samples

Greedy decoding with `generate` (chat template with `add_generation_prompt=True`,
at most 40 new tokens, stops at `<|im_end|>`):

{samples}

## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("resources/models/seqmoe-demo")
model = AutoModelForCausalLM.from_pretrained("resources/models/seqmoe-demo")
messages = [{{"role": "user", "content": "Hi! How are you today?"}}]
inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**inputs, max_new_tokens=40)
print(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```
"""


def format_sample(sample: dict) -> str:
    reply = sample["reply"] if sample["stopped_at_im_end"] else f"{sample['reply']} *(cut off at 40 tokens)*"
    turns = [(m["role"], m["content"]) for m in sample["messages"]] + [("assistant (generated)", reply)]
    return "\n>\n".join(f"> **{role}:** {text}".replace("\n", " / ") for role, text in turns)


# ----------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = parser.add_argument
    add("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "corpus",
        help=f"corpus folder containing {CORPUS_NAME}/")
    add("--out", type=Path, default=REPO_ROOT / "resources" / "models" / "seqmoe-demo", help="model folder to write")
    add("--work-dir", type=Path, default=REPO_ROOT / "build" / "demo-train", help="checkpoint and tokenizer folder")
    add("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
    add("--seed", type=int, default=1234, help="seed for the split, the data order and the initialisation")
    add("--steps", type=int, default=1500, help="optimizer steps (defines the LR schedule)")
    add("--max-minutes", type=float, default=48.0,
        help="training time limit: on a slower machine the LR schedule is compressed to end by then")
    add("--checkpoint-minutes", type=float, default=4.0, help="time between checkpoints")
    add("--batch-tokens", type=int, default=4096, help="padded tokens per batch")
    add("--max-seq-tokens", type=int, default=512, help="longer conversations are split at user turns")
    add("--lr", type=float, default=2e-3, help="peak learning rate")
    add("--weight-decay", type=float, default=0.1, help="AdamW weight decay of matrices")
    add("--warmup-fraction", type=float, default=0.05, help="share of the steps spent in linear warmup")
    add("--aux-loss-coef", type=float, default=0.02, help="router load-balancing loss coefficient")
    add("--val-fraction", type=float, default=0.05, help="share of conversations held out for validation")
    add("--vocab-size", type=int, default=4096, help="BPE vocabulary including special tokens")
    add("--hidden-size", type=int, default=192, help="model width")
    add("--layers", type=int, default=8, help="decoder layers, all MoE")
    add("--experts", type=int, default=16, help="routed experts per layer")
    add("--top-k", type=int, default=2, help="experts per token")
    add("--moe-intermediate-size", type=int, default=96, help="FFN width of one expert")
    return parser.parse_args()


def display_command() -> str:
    """The command line as typed from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO_ROOT) if script.is_relative_to(REPO_ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)  # denormal floats make CPU kernels many times slower
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    args.work_dir.mkdir(parents=True, exist_ok=True)

    conversations = load_conversations(args.data)
    train_convs, val_convs = split_by_conversation(conversations, args.val_fraction, args.seed)
    tokenizer_dir = args.work_dir / "tokenizer"
    if args.resume and tokenizer_dir.exists():
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        tok = train_tokenizer(train_convs, args.vocab_size)
        save_tokenizer(tok, tokenizer_dir)
    check_tokenizer(tok)

    def count_tokens(message: dict[str, str]) -> int:
        return len(encode_chat(tok, [message]))  # the template renders messages independently

    train_seqs = [encode_chat(tok, m) for m in training_chats(train_convs, args.seed, count_tokens, args.max_seq_tokens)]
    val_seqs = [encode_chat(tok, m) for m in validation_chats(val_convs, count_tokens, args.max_seq_tokens)]
    train_seqs = [s[: args.max_seq_tokens] for s in train_seqs]  # a single over-long turn pair is cut
    val_seqs = [s[: args.max_seq_tokens] for s in val_seqs]
    n_train_tokens = sum(map(len, train_seqs))
    print(f"{len(train_convs)} train / {len(val_convs)} val conversations; "
          f"{len(train_seqs)} training chats, {n_train_tokens:,} tokens", flush=True)

    model = build_model(tok, args)
    split = check_constraints(model)
    print(f"parameters: {split['total']:,} total, {split['routed_experts']:,} in routed experts "
          f"({100 * split['routed_expert_share']:.1f}%)", flush=True)
    state = train(model, train_seqs, tok.pad_token_id, args, display_command())

    export(model, tok, args.out)
    shipped, shipped_tok = load_exported(args.out)
    check_tokenizer(shipped_tok)
    evaluation = evaluate(shipped, val_seqs, unigram_log_probs(train_seqs, len(tok)), args.batch_tokens)
    samples = sample_conversations(shipped, shipped_tok)
    config = shipped.config
    last_losses = [entry["lm_loss"] for entry in state["log"][-50:]]
    report = {
        "seed": args.seed,
        "data": {
            "corpus": f"{CORPUS_NAME} (CC BY 4.0, Jandaghi et al. 2023, arXiv:2312.10007)",
            "conversations": len(conversations),
            "validation_conversations": len(val_convs),
            "validation_fraction": args.val_fraction,
            "training_chats": len(train_seqs),
            "training_tokens": n_train_tokens,
            "validation_chats": len(val_seqs),
        },
        "architecture": {
            "class": "Qwen3MoeForCausalLM",
            "layers": config.num_hidden_layers,
            "moe_layers": config.num_hidden_layers,
            "experts": config.num_experts,
            "top_k": config.num_experts_per_tok,
            "hidden_size": config.hidden_size,
            "moe_intermediate_size": config.moe_intermediate_size,
            "attention_heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads,
            "head_dim": shipped.model.layers[0].self_attn.head_dim,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings,
        },
        "parameters": {**parameter_split(shipped), "safetensors_bytes": (args.out / "model.safetensors").stat().st_size},
        "training": {
            "commands": state["commands"],  # more than one: resumed; total_seconds covers the last run
            "steps": args.steps,
            "steps_done": state["step"],
            "batch_tokens": args.batch_tokens,
            "max_sequence_tokens": args.max_seq_tokens,
            "tokens_seen": state["tokens"],
            "epochs_seen": state["tokens"] / n_train_tokens,
            "lr": args.lr,
            "weight_decay": args.weight_decay,
            "aux_loss_coef": args.aux_loss_coef,
            "loss_on": "all tokens",
            "train_seconds": state["train_seconds"],
            "final_train_loss": sum(last_losses) / len(last_losses),
            "loss_curve": state["log"][:: max(1, len(state["log"]) // 100)],
        },
        "evaluation": evaluation,
        "samples": samples,
        "total_seconds": time.monotonic() - started,
    }
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(report))

    print(json.dumps({k: report[k] for k in ("parameters", "evaluation", "samples")}, indent=2), flush=True)
    if report["parameters"]["safetensors_bytes"] > MAX_DISK_BYTES:
        raise SystemExit("model.safetensors is larger than the budget")
    collapsed = [r["layer"] for r in evaluation["routing"] if r["min_expert_share"] < MIN_USAGE_SHARE]
    if collapsed:
        raise SystemExit(f"router collapse in layers {collapsed}: retrain with a larger --aux-loss-coef")
    if not all(s["stopped_at_im_end"] for s in samples):
        print("warning: a sample reply did not end with <|im_end|> within 40 tokens", flush=True)


if __name__ == "__main__":
    main()
