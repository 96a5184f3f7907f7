"""What the cache's planning costs the host per decode layer, at a model's routing shape.

The simulator replays traces through the engine's own cache, policies and predictor on a
virtual clock; this tool times those calls on the real one (``acquire``, the policy's
``forecast``, the cache's ``plan``), per decode layer. The simulator runs the predictor at
every layer; the engine runs it every few layers when it is dear and the layers do not wait
for the link, so ``forecast`` here is an upper bound.

A routing shape as large as Qwen3-30B-A3B's (48 MoE layers of 128 experts, top-8) needs no
real weights; a random-weight model with tiny widths routes as many experts:

    python tools/time_planning.py model --out /tmp/q48
    seqmoe trace --model /tmp/q48 --text chat.txt --chat --every-turn --max-tokens 12000 --out /tmp/q48-traces
    seqmoe train-predictor --traces /tmp/q48-traces --out /tmp/q48.safetensors --epochs 2
    python tools/time_planning.py time --traces /tmp/q48-traces --predictor /tmp/q48.safetensors \\
        --cache-ratio 0.45 --tokens 1200

Random weights route differently from a trained model: the hit rates say nothing of the
policies, only the host time does.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from seqmoe import cache, policies
from seqmoe.hardware import HARDWARE, SHAPES
from seqmoe.predictor.model import load_predictor
from seqmoe.resources import demo_model_dir
from seqmoe.simulate import simulate
from seqmoe.trace import Traces, read_traces


def make_model(out: Path) -> None:
    """A random-weight Qwen3-MoE with Qwen3-30B-A3B's routing shape and the demo's tokenizer."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        vocab_size=4096, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=48, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=2, pad_token_id=0,
    )
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(demo_model_dir() / name, out / name)


def first_documents(traces: Traces, tokens: int) -> Traces:
    """The whole documents within the first ``tokens`` tokens."""
    if tokens >= traces.tokens:
        return traces
    keep = traces.document < traces.document[tokens]
    return dataclasses.replace(
        traces,
        hidden=traces.hidden[keep],
        experts=traces.experts[keep],
        probs=traces.probs[keep],
        document=traces.document[keep],
        decode=traces.decode[keep],
        paragraph=None if traces.paragraph is None else traces.paragraph[keep],
    )


class Timer:
    """Seconds spent in the wrapped methods, per name, and the decode layers they served."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.layers = 0

    def wrap(self, owner: type, method: str, name: str, counts_layer: bool = False) -> None:
        original: Callable = getattr(owner, method)

        def timed(instance, *args, **kwargs):
            prefill = kwargs.get("prefill", args[-1] if counts_layer else False)
            start = time.perf_counter()
            result = original(instance, *args, **kwargs)
            if not prefill:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.layers += counts_layer
            return result

        setattr(owner, method, timed)


def time_policies(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    timer = Timer()
    timer.wrap(cache.ExpertCache, "acquire", "acquire", counts_layer=True)
    timer.wrap(cache.ExpertCache, "plan", "plan")
    for policy in (policies.SeqMoEPolicy, policies.OraclePolicy):
        timer.wrap(policy, "forecast", "forecast")
    traces = first_documents(read_traces(args.traces), args.tokens)
    predictor = load_predictor(args.predictor) if args.predictor else None
    print(f"{traces.tokens} tokens, {int(traces.decode.sum())} decoded, {traces.experts.shape[1]} layers "
          f"of {traces.probs.shape[-1]} experts, cache ratio {args.cache_ratio}")
    for name in args.policies.split(","):
        timer.seconds.clear()
        timer.layers = 0
        result = simulate(traces, name, args.cache_ratio, HARDWARE["rtx4090-pcie4"], SHAPES["qwen3-30b-a3b"], predictor=predictor)
        parts = {part: seconds / timer.layers * 1e3 for part, seconds in timer.seconds.items()}
        # The look-ahead (forecast and plan) runs inside acquire, while the layer's misses load.
        total = parts.pop("acquire")
        parts["the rest"] = total - sum(parts.values())
        shown = ", ".join(f"{part} {ms:.3f}" for part, ms in parts.items())
        print(f"{name:8s} {result.cache_slots} slots, hit rate {result.as_dict()['hit_rate']:.4f}: "
              f"{total:.3f} ms per decode layer in acquire ({shown})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    model = commands.add_parser("model", help="write the random-weight model of Qwen3-30B-A3B's routing shape")
    model.add_argument("--out", type=Path, required=True)
    timing = commands.add_parser("time", help="time the planning over traces")
    timing.add_argument("--traces", type=Path, required=True)
    timing.add_argument("--predictor", type=Path, help="the seqmoe policy's predictor (needed for seqmoe)")
    timing.add_argument("--policies", default="lru,seqmoe,oracle")
    timing.add_argument("--cache-ratio", type=float, default=0.45)
    timing.add_argument("--tokens", type=int, default=1200, help="replay the whole documents within this many tokens")
    args = parser.parse_args()
    if args.command == "model":
        make_model(args.out)
    else:
        time_policies(args)


if __name__ == "__main__":
    main()
