"""Measured comparison of cache policies on one model, in one run.

Every policy generates the same greedy tokens (offloading never changes the output), so
decode speeds are comparable; the ``full`` policy, every expert resident, is the
reference that the others are measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine import Engine, Sampling
from .events import LayerRouted
from .stats import GenerationStats


@dataclass
class BenchRow:
    policy: str
    cache_ratio: float
    stats: GenerationStats
    relative_speed: float
    same_tokens: bool

    def as_dict(self) -> dict[str, object]:
        stats = self.stats
        return {
            "policy": self.policy,
            "cache_ratio": round(stats.cache_ratio, 4),
            "cache_slots": stats.cache_slots,
            "decode_tokens_per_s": stats.decode_tokens_per_s,
            "relative_to_full": self.relative_speed,
            "hit_rate": stats.hit_rate,
            "stall_ms_per_token": 1000 * stats.stall_seconds / max(stats.tokens, 1),
            "h2d_mib_per_token": stats.h2d_bytes / 2**20 / max(stats.tokens, 1),
            "same_tokens_as_full": self.same_tokens,
        }


def run_bench(
    engine: Engine, prompt_ids: list[int], policies: list[str], ratios: list[float], max_new_tokens: int
) -> list[BenchRow]:
    """Decode speed of each policy at each cache ratio, relative to ``full`` measured in the same run."""
    greedy = Sampling(max_new_tokens=max_new_tokens)
    engine.configure("full")
    engine.generate(prompt_ids, Sampling(max_new_tokens=4))
    reference = engine.generate(prompt_ids, greedy)
    rows = [BenchRow("full", 1.0, reference.stats, 1.0, True)]
    for ratio in ratios:
        future = None
        for policy in policies:
            if policy == "full":
                continue
            if policy == "oracle" and future is None:
                future = record_future(engine, prompt_ids, greedy, ratio)
            engine.configure(policy, cache_ratio=ratio, future=future if policy == "oracle" else None)
            result = engine.generate(prompt_ids, greedy)
            speed = result.stats.decode_tokens_per_s / reference.stats.decode_tokens_per_s
            rows.append(BenchRow(policy, ratio, result.stats, speed, result.token_ids == reference.token_ids))
    engine.close()
    return rows


def record_future(engine: Engine, prompt_ids: list[int], sampling: Sampling, ratio: float) -> list[tuple[int, frozenset[int]]]:
    """Every cache access of the greedy run at this cache size, for the oracle to know in advance."""
    accesses: list[tuple[int, frozenset[int]]] = []

    def listen(event: object) -> None:
        if isinstance(event, LayerRouted):
            accesses.append((event.layer, frozenset(event.experts)))

    engine.configure("lru", cache_ratio=ratio)
    engine.events.subscribe(listen)
    try:
        engine.generate(prompt_ids, sampling)
    finally:
        engine.events.unsubscribe(listen)
    return accesses


def format_table(rows: list[BenchRow]) -> str:
    header = f"{'policy':<8}{'ratio':>7}{'slots':>7}{'tok/s':>9}{'vs full':>9}{'hit rate':>10}{'stall ms/tok':>14}{'MiB/tok':>9}  same"
    lines = [header]
    for row in rows:
        d = row.as_dict()
        lines.append(
            f"{d['policy']:<8}{d['cache_ratio']:>7.2f}{d['cache_slots']:>7}{d['decode_tokens_per_s']:>9.2f}"
            f"{d['relative_to_full']:>9.1%}{d['hit_rate']:>10.1%}{d['stall_ms_per_token']:>14.2f}"
            f"{d['h2d_mib_per_token']:>9.2f}  {'yes' if d['same_tokens_as_full'] else 'NO'}"
        )
    return "\n".join(lines)
