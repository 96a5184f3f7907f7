"""The engine worker with the real engine on a tiny model: loading with progress and
cancellation, streaming, stopping within a token, failures, long conversations."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
from seqmoe.errors import SeqMoEError
from seqmoe.hardware import DEFAULT_SETUP

from seqmoe_chat import worker as worker_module
from seqmoe_chat.store import EngineOptions, SamplingSettings
from seqmoe_chat.store.settings import DEFAULT_LINK_GBPS, DEFAULT_LINK_SETUP
from seqmoe_chat.worker import EngineWorker, ReplyResult, link_setup

GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=24)


class Recorder:
    """Collects a worker's signals; the worker runs on the test's thread, so they arrive at once."""

    def __init__(self, worker: EngineWorker) -> None:
        self.events: list[tuple] = []
        for name in ("sig_load_progressed", "sig_model_loaded", "sig_load_failed", "sig_load_cancelled",
                     "sig_reply_streamed", "sig_reply_finished", "sig_reply_failed", "sig_reply_needs_model"):
            getattr(worker, name).connect(lambda *args, name=name: self.events.append((name, *args)))

    def of(self, name: str) -> list[tuple]:
        return [event[1:] for event in self.events if event[0] == name]


@pytest.fixture
def worker() -> EngineWorker:
    made = EngineWorker()
    yield made
    made.unload()


def test_loading_reports_progress_and_replies_stream(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5))
    fractions = [fraction for _, _, fraction in recorder.of("sig_load_progressed")]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) >= 4
    ((_, info),) = recorder.of("sig_model_loaded")
    assert (info.name, info.device, info.architecture, info.policy) == ("tiny-qwen3-moe", "cpu", "Qwen3MoeForCausalLM", "seqmoe")
    worker.generate(2, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], GREEDY)
    ((_, result),) = recorder.of("sig_reply_finished")
    assert isinstance(result, ReplyResult) and not result.stopped and result.model_id == "tiny-qwen3-moe"
    streamed = recorder.of("sig_reply_streamed")
    assert streamed and all(result.text.startswith(text) for _, text, _ in streamed)
    assert [tokens for _, _, tokens in streamed] == sorted(tokens for _, _, tokens in streamed)
    for key in ("tokens", "tokens_per_s", "time_to_first_token", "hit_rate", "stall_seconds", "cache_ratio"):
        assert key in result.stats


def test_a_reasoning_models_reply_streams_and_keeps_only_its_answer(
    worker: EngineWorker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.core.harmony import ANSWER, QUESTION, build_harmony_model

    monkeypatch.setattr(worker_module, "STREAM_INTERVAL_S", 0.0)  # every token's text streamed
    recorder = Recorder(worker)
    worker.load(1, str(build_harmony_model(tmp_path / "tiny-gpt-oss")), EngineOptions(policy="lru"))
    worker.generate(2, [{"role": "user", "content": QUESTION}], GREEDY)
    ((_, result),) = recorder.of("sig_reply_finished")
    streamed = [text for _, text, _ in recorder.of("sig_reply_streamed")]
    # The analysis streams as the waiting state (no text), then the answer; it is what the chat stores.
    assert result.text == ANSWER and streamed == [""] * 13 + ["Hello", ANSWER, ANSWER]


def test_stop_takes_effect_within_one_token(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions())
    worker.sig_reply_streamed.connect(lambda request_id, text, tokens: worker.cancel(request_id))
    worker.generate(2, [{"role": "user", "content": "Tell me a long story"}], SamplingSettings(max_new_tokens=100, seed=1))
    ((_, result),) = recorder.of("sig_reply_finished")
    # Cancelled while the first token was handed out: at most the token being computed follows.
    assert result.stopped and result.stats["tokens"] <= 2
    worker.cancel(3)
    worker.generate(3, [{"role": "user", "content": "Stopped before it started"}], GREEDY)
    worker.cancel_through(5)  # the app closing: every request so far
    worker.generate(4, [{"role": "user", "content": "Given up with the rest"}], GREEDY)
    assert len(recorder.of("sig_reply_finished")) == 1 and not recorder.of("sig_reply_failed")


def test_stops_are_forgotten_once_their_replies_are_handled(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions())
    short = SamplingSettings(temperature=0.0, max_new_tokens=1)
    for request_id in range(2, 7):
        worker.generate(request_id, [{"role": "user", "content": "Hi"}], short)
        worker.cancel(request_id)  # Stop pressed as the reply ended
    worker.cancel(8)  # a reply queued behind the next one, stopped before its turn
    worker.generate(7, [{"role": "user", "content": "Hi"}], short)
    worker.generate(8, [{"role": "user", "content": "Hi"}], short)
    finished = recorder.of("sig_reply_finished")
    assert [request_id for request_id, _ in finished] == [2, 3, 4, 5, 6, 7] and not finished[-1][1].stopped
    assert worker._cancelled_ids == {8}  # one entry per Stop would grow for as long as the app runs


def test_loading_can_be_cancelled_between_stages(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.sig_load_progressed.connect(lambda request_id, stage, fraction: fraction >= 0.1 and worker.cancel(request_id))
    worker.load(1, str(tiny_model), EngineOptions())
    assert recorder.of("sig_load_cancelled") == [(1,)] and not recorder.of("sig_model_loaded")
    worker.generate(2, [{"role": "user", "content": "Hello?"}], GREEDY)
    assert recorder.of("sig_reply_needs_model") == [(2,)] and not recorder.of("sig_reply_failed")


def test_a_load_given_up_before_it_starts_still_lets_the_previous_model_go(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions())
    worker.cancel(2)  # the user asked for another model, then gave up while a reply held the worker
    worker.load(2, str(tiny_model), EngineOptions())
    assert recorder.of("sig_load_cancelled") == [(2,)]
    worker.generate(3, [{"role": "user", "content": "Hello?"}], GREEDY)
    assert recorder.of("sig_reply_needs_model") == [(3,)] and not recorder.of("sig_reply_finished")


def test_unloading_gives_the_models_memory_back_at_once(worker: EngineWorker, tiny_model: Path) -> None:
    """Without a garbage collection: one on the worker's thread could finalise the GUI's Qt
    objects and deadlock with the GUI thread."""
    recorder = Recorder(worker)
    gc.disable()
    try:
        worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5))
        worker.generate(2, [{"role": "user", "content": "Hi!"}], GREEDY)
        model = weakref.ref(worker._engine.loaded.model)
        worker.unload()
        assert recorder.of("sig_reply_finished") and model() is None
    finally:
        gc.enable()


def test_a_model_that_cannot_be_loaded_says_why(worker: EngineWorker, tmp_path: Path) -> None:
    recorder = Recorder(worker)
    (tmp_path / "not-a-model").mkdir()
    worker.load(1, str(tmp_path / "not-a-model"), EngineOptions())
    ((_, reason, _kept),) = recorder.of("sig_load_failed")
    assert "config.json" in reason and "unexpectedly" not in reason


def test_a_model_refused_by_its_checks_leaves_the_model_loaded_before_working(
    worker: EngineWorker, tiny_model: Path, tmp_path: Path
) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5))
    worker.generate(2, [{"role": "user", "content": "Hi!"}], GREEDY)
    (tmp_path / "not-a-model").mkdir()
    worker.load(3, str(tmp_path / "not-a-model"), EngineOptions())
    ((_, reason, kept),) = recorder.of("sig_load_failed")
    assert "config.json" in reason and kept.name == "tiny-qwen3-moe" and kept.cache_slots == recorder.of("sig_model_loaded")[0][1].cache_slots
    worker.generate(4, [{"role": "user", "content": "Hi!"}], GREEDY)
    first, again = recorder.of("sig_reply_finished")
    assert again[1].text == first[1].text and not recorder.of("sig_reply_needs_model")
    # Refused once its memory was wanted (the cache cannot be built): the model before is gone.
    worker.load(5, str(tiny_model), EngineOptions(cache_ratio=0.01))
    assert recorder.of("sig_load_failed")[-1][2] is None
    worker.generate(6, [{"role": "user", "content": "Hi!"}], GREEDY)
    assert recorder.of("sig_reply_needs_model") == [(6,)]


def test_too_small_a_cache_is_refused_with_the_engines_message(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.01))
    ((_, reason, _kept),) = recorder.of("sig_load_failed")
    assert "cache" in reason.lower() and "unexpectedly" not in reason


def test_a_budget_too_small_names_its_figure_and_where_to_change_it(worker: EngineWorker, tiny_model: Path) -> None:
    # Saved, it failed every start saying "a budget of 0.00 GiB", and not where the budget is set.
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(vram_budget_gb=0.001))
    ((_, reason, _kept),) = recorder.of("sig_load_failed")
    assert reason.startswith("a budget of 0.001 GiB leaves 0 expert slots")
    assert reason.endswith("Change the VRAM budget in Settings ▸ Engine, then load the model again.")


def test_a_long_conversation_is_trimmed_to_the_models_context(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions())
    history = []
    for turn in range(8):
        history += [{"role": "user", "content": f"question {turn} " * 8}, {"role": "assistant", "content": "answer " * 10}]
    history.append({"role": "user", "content": "And finally?"})
    worker.generate(2, [{"role": "system", "content": "Be brief."}, *history], SamplingSettings(max_new_tokens=500, seed=3))
    ((_, result),) = recorder.of("sig_reply_finished")
    assert result.stats["prompt_tokens"] + result.stats["tokens"] <= 256


def test_the_context_in_the_settings_trims_the_conversation_and_refuses_one_message_past_it(
    worker: EngineWorker, tiny_model: Path
) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(context_tokens=96))
    ((_, info),) = recorder.of("sig_model_loaded")
    assert info.context_tokens == 96 and info.context_limit == 256
    history = []
    for turn in range(4):
        history += [{"role": "user", "content": f"question {turn} " * 4}, {"role": "assistant", "content": "answer " * 4}]
    worker.generate(2, [*history, {"role": "user", "content": "And finally?"}], SamplingSettings(max_new_tokens=500, seed=3))
    ((_, result),) = recorder.of("sig_reply_finished")
    used = result.stats["prompt_tokens"] + result.stats["tokens"]
    assert 0 < result.stats["prompt_tokens"] and used <= 96 and result.stats["context_full"] == (used == 96)
    worker.generate(3, [{"role": "user", "content": "word " * 200}], GREEDY)
    ((request, reason, _partial),) = recorder.of("sig_reply_failed")
    assert request == 3 and "the context holds 96 (as set" in reason and reason.endswith("in Settings ▸ Engine")


def test_the_emulated_link_follows_the_setup_or_the_fixed_speed_and_listeners_hear_only_replies(
    worker: EngineWorker, tiny_model: Path
) -> None:
    recorder = Recorder(worker)
    heard: list = []
    worker.watch_events(heard.append)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5))
    ((_, matched),) = recorder.of("sig_model_loaded")
    assert "Timing decode to match the emulated link to the setup" in [stage for _, stage, _ in recorder.of("sig_load_progressed")]
    assert (matched.link, matched.link_setup, matched.policy) == ("emulated", DEFAULT_SETUP, "seqmoe")
    assert matched.link_gbps < DEFAULT_LINK_GBPS  # a tiny model's decode takes microseconds a layer
    reconfigured: list = []
    worker.sig_model_reconfigured.connect(lambda _request, info: reconfigured.append(info))
    worker.reconfigure(2, EngineOptions(cache_ratio=0.5, link_setup=None, link_gbps=2.5))
    worker.reconfigure(3, EngineOptions(cache_ratio=0.5, link_setup="rtx4060laptop-pcie4x8-olmoe"))
    fixed, laptop = reconfigured
    assert (fixed.link_setup, fixed.link_gbps, fixed.policy) == (None, 2.5, "seqmoe")
    assert laptop.link_setup == "rtx4060laptop-pcie4x8-olmoe" and laptop.link_gbps != 2.5 and laptop.policy == "seqmoe"
    assert heard == [], "timing the link is no reply of the user's"
    worker.generate(4, [{"role": "user", "content": "Hi!"}], GREEDY)
    assert recorder.of("sig_reply_finished") and heard


def test_a_setup_this_version_does_not_know_is_the_default_one() -> None:
    # Settings of a later version may name a setup this one lacks; the store keeps the name as given.
    assert link_setup(EngineOptions(link_setup="rtx6090-pcie6-olmoe")) == DEFAULT_SETUP == DEFAULT_LINK_SETUP
    assert link_setup(EngineOptions(link_setup="rtx4060laptop-pcie4x8-olmoe")) == "rtx4060laptop-pcie4x8-olmoe"
    assert link_setup(EngineOptions(link_setup=None)) is None


def test_a_link_that_cannot_be_timed_keeps_the_fixed_speed_and_the_model_loads(
    worker: EngineWorker, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqmoe.bench

    def no_decode(*_args: object, **_kwargs: object) -> float:
        raise SeqMoEError("no reply went past its first token, so there is no decode to time; give other prompts")

    monkeypatch.setattr(seqmoe.bench, "match_link", no_decode)
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5, link_gbps=3.0))
    ((_, info),) = recorder.of("sig_model_loaded")
    assert (info.link_setup, info.link_gbps) == (None, 3.0)
    worker.generate(2, [{"role": "user", "content": "Hi!"}], GREEDY)
    assert recorder.of("sig_reply_finished")


def test_a_chats_next_reply_reads_only_the_new_turn(worker: EngineWorker, tiny_model: Path) -> None:
    recorder = Recorder(worker)
    worker.load(1, str(tiny_model), EngineOptions(cache_ratio=0.5, link_setup=None))
    messages = [{"role": "user", "content": "Hi!"}]
    worker.generate(2, messages, GREEDY)
    ((_, first),) = recorder.of("sig_reply_finished")
    worker.generate(3, [*messages, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And?"}], GREEDY)
    second = recorder.of("sig_reply_finished")[1][1]
    assert first.stats["reused_prompt_tokens"] == 0
    assert first.stats["prompt_tokens"] <= second.stats["reused_prompt_tokens"] < second.stats["prompt_tokens"]


def test_a_stored_temperature_below_the_engines_least_samples_greedily() -> None:
    from seqmoe_chat.worker import _engine_sampling

    # A hand-edited or imported chat may hold one: the engine refuses it as a sampling temperature.
    assert _engine_sampling(SamplingSettings(temperature=0.005)).greedy
    assert not _engine_sampling(SamplingSettings(temperature=0.01)).greedy
