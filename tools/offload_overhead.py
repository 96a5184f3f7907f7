"""What the offloaded path costs before any copy: decode speed of ``full`` against ``lru`` with
every expert cached (no copy, no eviction), alternated, best of a few runs each.

Measured on the demo model on two CPU cores (2026-12-07), in three runs: 85–87% of ``full``
(171–188 tokens/s against 195–216). With copies nearly free as well (``seqmoe bench --link-gbps 1000`` at cache
ratio 0.45) every policy stayed near 0.7 of ``full``: the path and the copies' host work, not
the link, capped them there. On a GPU this tool says how much of that remains.

    python tools/offload_overhead.py [--model PATH] [--device cpu|cuda] [--rounds 2]
"""

from __future__ import annotations

import argparse

from seqmoe import Engine, Sampling, load_model
from seqmoe.resources import demo_model_dir

PROMPT = "Hi! What do you like to do on weekends?"


def decode_speed(engine: Engine, prompt: list[int], policy: str, tokens: int, runs: int) -> float:
    """The best decode tokens/s of ``runs`` replies (the first call's one-off setup excluded)."""
    engine.configure(policy, cache_ratio=1.0)
    engine.generate(prompt, Sampling(max_new_tokens=4))
    return max(engine.generate(prompt, Sampling(max_new_tokens=tokens)).stats.decode_tokens_per_s for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(demo_model_dir()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    engine = Engine(load_model(args.model, device=args.device))
    prompt = engine.encode(PROMPT, chat=bool(engine.loaded.tokenizer.chat_template))
    for round_ in range(1, args.rounds + 1):
        full = decode_speed(engine, prompt, "full", args.tokens, 3)
        cached = decode_speed(engine, prompt, "lru", args.tokens, 3)
        print(f"round {round_}: full {full:.1f} tok/s, lru with every expert cached {cached:.1f} tok/s "
              f"({cached / full:.0%} of full)")
    engine.close()


if __name__ == "__main__":
    main()
