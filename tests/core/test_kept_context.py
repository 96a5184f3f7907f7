"""The KV cache kept between a chat's turns: the next turn's prompt skips the tokens it holds,
and the reply is the one a fresh prefill gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqmoe import Engine, Sampling, load_model

from .conftest import FAMILIES

GREEDY = Sampling(max_new_tokens=6)
FIRST = [5, 17, 42, 99, 23, 64, 7]
FULL_ATTENTION = (
    "mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "granitemoe", "phimoe", "minimax_m2",
    "longcat_flash",
)
"""Families whose cache is plain full attention, which can be cut back; the others start afresh."""


@pytest.fixture(params=sorted(FAMILIES))
def engine(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Engine:
    made = Engine(load_model(str(tiny_models[request.param]), device="cpu"))
    made.configure("lru", cache_ratio=0.5)
    made.family = request.param
    yield made
    made.close()


def test_a_chats_next_turn_skips_what_the_last_reply_held_and_replies_as_afresh(engine: Engine) -> None:
    one = engine.generate(FIRST, GREEDY, keep_context=True)
    second = FIRST + one.token_ids + [9, 11, 13]
    two = engine.generate(second, GREEDY, keep_context=True)
    again = engine.generate(second, GREEDY, keep_context=True)  # a regenerated reply: all but the last token
    fresh = engine.generate(second, GREEDY)
    assert two.token_ids == again.token_ids == fresh.token_ids
    assert fresh.stats.reused_prompt_tokens == 0 and one.stats.reused_prompt_tokens == 0
    if engine.family in FULL_ATTENTION:
        # The cache holds the first prompt and the reply but its last token, which it never fed back.
        assert two.stats.reused_prompt_tokens == len(FIRST) + len(one.token_ids) - 1
        assert again.stats.reused_prompt_tokens == len(second) - 1
    else:
        assert two.stats.reused_prompt_tokens == again.stats.reused_prompt_tokens == 0


def test_a_call_that_keeps_nothing_or_fails_leaves_nothing_to_reuse(tiny_models: dict[str, Path]) -> None:
    engine = Engine(load_model(str(tiny_models["mixtral"]), device="cpu"))
    engine.configure("lru", cache_ratio=0.5)
    one = engine.generate(FIRST, GREEDY, keep_context=True)
    engine.generate([3, 4, 5], GREEDY)  # e.g. the link's timing runs
    assert engine.generate(FIRST + one.token_ids, GREEDY, keep_context=True).stats.reused_prompt_tokens == 0

    def broken(_token: int) -> None:
        raise RuntimeError("the listener broke")

    with pytest.raises(RuntimeError):
        engine.generate(FIRST, GREEDY, on_token=broken, keep_context=True)
    assert engine.generate(FIRST + [8], GREEDY, keep_context=True).stats.reused_prompt_tokens == 0
    engine.close()
