"""The hit rate every report gives: experts found on their way are not hits."""

from __future__ import annotations

import pytest

from seqmoe.bench import Totals
from seqmoe.stats import GenerationStats


def reply(hits: int, late: int, misses: int, tokens: int = 5) -> GenerationStats:
    return GenerationStats(
        tokens=tokens, seconds=1.0, hits=hits, misses=misses, stall_seconds=0.0, h2d_bytes=0, cache_slots=4,
        total_experts=8, policy="seqmoe", device="cpu", link="emulated", late=late,
        decode_hits=hits, decode_late=late, decode_misses=misses,
    )


def test_a_late_expert_counts_against_the_hit_rate() -> None:
    stats = reply(hits=6, late=2, misses=2)
    assert stats.hit_rate == pytest.approx(0.6)
    assert stats.decode_hit_rate == pytest.approx(0.6)


def test_a_reply_that_used_no_expert_missed_none() -> None:
    assert reply(hits=0, late=0, misses=0, tokens=1).hit_rate == 1.0


def test_the_bench_sums_the_prompts_before_dividing() -> None:
    figures = Totals([reply(hits=9, late=1, misses=0), reply(hits=0, late=0, misses=10)]).as_dict()
    assert figures["hit_rate"] == pytest.approx(9 / 20)
    assert figures["late_rate"] == pytest.approx(1 / 20)
    assert Totals([reply(0, 0, 0, tokens=1)]).as_dict()["late_rate"] == 0.0
