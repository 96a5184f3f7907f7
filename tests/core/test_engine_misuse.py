"""The engine's API used wrongly, as an app might: every such call is a ``SeqMoEError`` saying
why, and the engine stays right for the next reply; nothing is computed from settings that make
no sense (a link of NaN µs once ran the model on slots never filled)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from seqmoe import Engine, Sampling, SeqMoEError, load_model
from seqmoe.errors import BudgetTooSmall
from seqmoe.resources import demo_model_dir

from .test_equivalence import PROMPT

GREEDY = Sampling(max_new_tokens=6)


@pytest.fixture(scope="module")
def mixtral(tiny_models: dict[str, Path]):
    return load_model(str(tiny_models["mixtral"]), device="cpu")


@pytest.mark.parametrize("link", [{"link_latency_us": math.nan}, {"link_latency_us": math.inf},
                                  {"link_gbps": math.nan}, {"link_gbps": math.inf}, {"link_gbps": 0}])
def test_a_link_that_is_no_number_is_refused(mixtral, link: dict[str, float]) -> None:
    with pytest.raises(SeqMoEError, match="the emulated link needs"):
        Engine(mixtral, **link)


def test_a_link_speed_set_after_the_engine_was_made_is_checked_when_it_is_used(mixtral) -> None:
    engine = Engine(mixtral)
    engine.link_gbps = math.nan
    with pytest.raises(SeqMoEError, match="the emulated link needs"):
        engine.configure("lru", cache_ratio=0.5)


@pytest.mark.parametrize("bad", [
    lambda: Sampling(max_new_tokens=math.nan),
    lambda: Sampling(max_new_tokens=2.5),
    lambda: Sampling(seed=2**70),
    lambda: Sampling(seed=-1),
    lambda: Sampling(seed=2**32),  # torch's CPU generator would take it as seed 0
    lambda: Sampling(greedy="no"),  # a truthy string would decode greedily
    lambda: Sampling(greedy=False, temperature="1"),
    lambda: Sampling(top_p="0.5"),
])
def test_sampling_that_is_no_count_is_refused(bad) -> None:
    with pytest.raises(SeqMoEError):
        bad()


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 0.001, math.inf, math.nan, 101.0, -1.0])
def test_a_temperature_at_which_sampling_is_no_sampling_is_refused_when_it_is_given(temperature: float) -> None:
    # 1e-45 was taken, and generating with it failed as if transformers could not run the model.
    with pytest.raises(SeqMoEError, match="temperature must be above 0 .*: from 0.01 to 100.0, not"):
        Sampling(greedy=False, temperature=temperature)


def test_the_apps_temperatures_and_seeds_sample(mixtral) -> None:
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    for temperature, seed in ((0.01, 0), (2.0, 2**31 - 1), (1.0, 2**32 - 1)):
        assert engine.generate(PROMPT, Sampling(6, greedy=False, temperature=temperature, seed=seed)).token_ids


def test_sampling_cannot_be_changed_past_its_checks() -> None:
    sampling = Sampling(greedy=False, temperature=0.7)
    with pytest.raises(FrozenInstanceError):
        sampling.temperature = 0.0  # generating with it once divided the logits by 0


def test_prompts_and_budgets_that_are_no_such_thing_are_refused(mixtral) -> None:
    engine = Engine(mixtral)
    vocabulary = mixtral.model.get_input_embeddings().num_embeddings
    for prompt in ([5, vocabulary], [-1], "Hello"):
        with pytest.raises(SeqMoEError, match="token ids from 0"):
            engine.generate(prompt, GREEDY)
    with pytest.raises(BudgetTooSmall, match="must be a number of GB"):
        engine.configure("lru", vram_budget_gb=1e300)
    with pytest.raises(SeqMoEError, match="at least a prompt token"):
        Engine(mixtral, context_tokens=math.nan)


def test_a_stop_callback_that_returns_none_means_go_on(mixtral) -> None:
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    assert engine.generate(PROMPT, GREEDY, should_stop=lambda: None).token_ids == engine.generate(PROMPT, GREEDY).token_ids


@pytest.mark.parametrize("change", [
    lambda engine: engine.configure("seqmoe", cache_ratio=0.5),
    lambda engine: engine.resize(cache_ratio=0.8),
    lambda engine: engine.close(),
    lambda engine: engine.generate(PROMPT, GREEDY),
])
def test_the_cache_is_not_changed_under_a_reply_and_the_next_reply_is_right(mixtral, change) -> None:
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    expected = engine.generate(PROMPT, GREEDY)

    def meddle(_token: int) -> None:
        change(engine)

    with pytest.raises(SeqMoEError, match="while a reply is generated"):
        engine.generate(PROMPT, GREEDY, on_token=meddle)
    again = engine.generate(PROMPT, GREEDY)
    assert again.token_ids == expected.token_ids and engine.cache_slots == expected.stats.cache_slots
    # One cache's counters: every access counted once, none negative (mixing two caches' gave -116 misses).
    assert min(again.stats.prefill_misses, again.stats.decode_misses, again.stats.h2d_bytes) >= 0
    assert again.stats.hits + again.stats.misses == expected.stats.hits + expected.stats.misses


def test_full_counts_the_prompts_accesses_as_prefill_like_a_cache_holding_every_expert(mixtral) -> None:
    engine = Engine(mixtral)
    engine.configure("full")
    full = engine.generate(PROMPT, GREEDY).stats
    engine.configure("lru", cache_ratio=1.0)
    lru = engine.generate(PROMPT, GREEDY).stats
    assert full.prefill_hits > 0 and (full.prefill_hits, full.decode_hits) == (lru.prefill_hits + lru.prefill_misses,
                                                                                lru.decode_hits + lru.decode_misses)


@pytest.mark.parametrize("horizon", [0, -1, 1.5, "2", True])
def test_a_forecast_horizon_that_is_no_count_of_layers_is_refused(horizon: object) -> None:
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"))
    engine.horizon = horizon
    with pytest.raises(SeqMoEError, match="forecast horizon"):
        engine.configure("seqmoe", cache_ratio=0.5)


def test_the_horizon_the_forecasts_reach_is_the_one_reported() -> None:
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"))
    engine.horizon = 100  # past the predictor's own: as far as it sees
    engine.configure("seqmoe", cache_ratio=0.5)
    assert engine.forecast_horizon == engine.max_horizon() == engine.cache.policy.horizon
    engine.horizon = 2
    engine.configure("seqmoe", cache_ratio=0.5)
    assert engine.forecast_horizon == engine.cache.policy.horizon == 2


@pytest.mark.parametrize("first", ["generate", "configure"])
@pytest.mark.parametrize("second", [
    lambda engine: engine.generate(PROMPT, GREEDY),
    lambda engine: engine.configure("lru", cache_ratio=0.3),
    lambda engine: engine.resize(cache_ratio=0.3),
    lambda engine: engine.close(),
], ids=["generate", "configure", "resize", "close"])
def test_a_call_from_another_thread_while_one_is_at_work_is_refused(
    mixtral, monkeypatch: pytest.MonkeyPatch, first: str, second
) -> None:
    # Two replies at once once failed deep in the cache (KeyError) or counted negative misses.
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    expected = engine.generate(PROMPT, GREEDY)
    inside, go_on = threading.Event(), threading.Event()

    def hold(method: Callable[..., object]) -> Callable[..., object]:
        def held(self: Engine, *args: object) -> object:
            if not inside.is_set():  # the first call waits here, at work, until the second is done
                inside.set()
                go_on.wait(30)
            return method(self, *args)
        return held

    monkeypatch.setattr(Engine, "reply_room", hold(Engine.reply_room))  # generate's first step
    monkeypatch.setattr(Engine, "_make_policy", hold(Engine._make_policy))  # configure's
    done: list[object] = []
    calls = {"generate": lambda: engine.generate(PROMPT, GREEDY), "configure": lambda: engine.configure("lru", cache_ratio=0.5)}
    worker = threading.Thread(target=lambda: done.append(calls[first]()))
    worker.start()
    try:
        assert inside.wait(30)
        with pytest.raises(SeqMoEError, match="while a reply is generated or the cache is changed"):
            second(engine)
    finally:
        go_on.set()
        worker.join(60)
    assert len(done) == 1
    replies = [engine.generate(PROMPT, GREEDY), *(done if first == "generate" else [])]
    for reply in replies:
        assert reply.token_ids == expected.token_ids and reply.stats.cache_slots == expected.stats.cache_slots
        assert reply.stats.hits + reply.stats.misses == expected.stats.hits + expected.stats.misses


def test_a_loaded_model_takes_one_engine_at_a_time(mixtral) -> None:
    first = Engine(mixtral)
    first.configure("lru", cache_ratio=0.5)
    expected = first.generate(PROMPT, GREEDY)
    with pytest.raises(SeqMoEError, match="another engine uses this model's experts"):
        Engine(mixtral)
    first.close()
    made, waiting = Engine(mixtral), Engine(mixtral)  # neither uses the model yet
    made.configure("lru", cache_ratio=0.5)
    for use in (lambda: waiting.configure("lru", cache_ratio=0.3), lambda: waiting.generate(PROMPT, GREEDY)):
        with pytest.raises(SeqMoEError, match="another engine uses this model's experts"):
            use()
    waiting.close()  # leaves the other's cache attached to the model
    again = made.generate(PROMPT, GREEDY)
    assert again.token_ids == expected.token_ids and again.stats.cache_slots == expected.stats.cache_slots
    assert again.stats.hits + again.stats.misses == expected.stats.hits + expected.stats.misses


def test_a_closed_engine_refuses_to_generate_or_build_a_cache(mixtral) -> None:
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    engine.close()
    engine.close()  # again: nothing to do
    for call in (lambda: engine.generate(PROMPT, GREEDY), lambda: engine.configure("lru", cache_ratio=0.5),
                 lambda: engine.resize(cache_ratio=0.3)):
        with pytest.raises(SeqMoEError, match="the engine is closed"):
            call()
    assert engine.cached_experts == []


def test_after_a_configure_that_failed_the_engine_generates_once_one_succeeds(mixtral) -> None:
    # It used to build its default cache, every expert, which may not fit the budget asked for.
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.3)
    engine.link_gbps = math.nan
    with pytest.raises(SeqMoEError, match="the emulated link needs"):
        engine.configure("lru", cache_ratio=0.3)
    engine.link_gbps = 25.0
    with pytest.raises(SeqMoEError, match="configure one before generating"):
        engine.generate(PROMPT, GREEDY)
    engine.configure("lru", cache_ratio=0.3)
    assert engine.generate(PROMPT, GREEDY).stats.cache_slots == engine.geometry.slots_for_ratio(0.3)


@pytest.mark.parametrize("stop_after_layers", [0, 1])
def test_a_stop_during_the_prompt_ends_the_reply_before_its_first_token(mixtral, stop_after_layers: int) -> None:
    # Checked only after each token, a stop waited for the whole prefill, minutes for a long prompt.
    reference = Engine(mixtral)
    expected = reference.generate(PROMPT, GREEDY).token_ids
    reference.close()
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return len(asked) > stop_after_layers

    stopped = engine.generate(PROMPT, GREEDY, should_stop=should_stop)
    assert stopped.token_ids == [] and stopped.text == "" and stopped.stats.tokens == 0
    assert len(asked) == stop_after_layers + 1  # no MoE layer ran after the stop
    assert engine.generate(PROMPT, GREEDY, keep_context=True).token_ids == expected
    engine.close()


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_that_is_not_utf8_is_refused_in_one_line(mixtral, chat: bool) -> None:
    # Bytes that are not UTF-8 in a command-line argument become a lone surrogate: the tokenizer
    # raised a TypeError (a traceback), the chat template a message blaming the template.
    engine = Engine(mixtral)
    with pytest.raises(SeqMoEError, match="the prompt is not valid UTF-8 text: it holds a lone surrogate"):
        engine.encode("caf\udce9", chat=chat)
    engine.close()


def test_a_reply_that_ends_itself_as_the_context_fills_is_not_said_to_be_cut_off() -> None:
    loaded = load_model(str(demo_model_dir()), device="cpu")
    engine = Engine(loaded)
    prompt = engine.encode("Tell me about the sea.", chat=True)
    free = engine.generate(prompt, Sampling(max_new_tokens=200))
    engine.close()
    assert free.token_ids[-1] == loaded.model.generation_config.eos_token_id and not free.stats.context_full
    engine = Engine(loaded, context_tokens=len(prompt) + len(free.token_ids))
    exact = engine.generate(prompt, Sampling(max_new_tokens=200))
    assert exact.token_ids == free.token_ids and not exact.stats.context_full
    engine.close()
    engine = Engine(loaded, context_tokens=len(prompt) + len(free.token_ids) - 1)
    cut = engine.generate(prompt, Sampling(max_new_tokens=200))
    assert cut.token_ids == free.token_ids[:-1] and cut.stats.context_full


def test_a_stop_during_a_chats_next_prompt_keeps_the_turns_before_it(mixtral) -> None:
    # Dropped, every earlier turn was read again after a stop: minutes on an offloaded model.
    engine = Engine(mixtral)
    engine.configure("lru", cache_ratio=0.5)
    first = engine.generate(PROMPT, GREEDY, keep_context=True)
    second_prompt = PROMPT + first.token_ids + [7, 8, 9, 10]
    asked = []
    stopped = engine.generate(second_prompt, GREEDY, should_stop=lambda: bool(asked.append(True)) or len(asked) > 1,
                              keep_context=True)
    assert stopped.token_ids == [] and stopped.stats.reused_prompt_tokens > len(PROMPT)
    again = engine.generate(second_prompt, GREEDY, keep_context=True)
    assert again.stats.reused_prompt_tokens == stopped.stats.reused_prompt_tokens
    engine.close()
    fresh = Engine(mixtral)
    assert again.token_ids == fresh.generate(second_prompt, GREEDY).token_ids
    fresh.close()
