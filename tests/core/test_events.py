"""The event stream as a listener sees it, and resizing the cache between generations."""

from __future__ import annotations

import gc
import threading
import weakref
from collections import Counter
from collections.abc import Callable

import pytest
import torch

import seqmoe.cache
from seqmoe import BudgetTooSmall, Engine, Sampling, load_model
from seqmoe.events import (
    CacheSnapshot,
    EventBuffer,
    ExpertEvicted,
    ExpertsForecast,
    LayerRouted,
    PrefetchCancelled,
    PrefetchIssued,
    PrefetchUnused,
    SlotStatus,
    Stall,
    TokenGenerated,
)
from seqmoe.resources import demo_model_dir
from seqmoe.transfer import JobState

PROMPT = "Tell me about the mountains you like to hike."
TOKENS = 12


@pytest.fixture(scope="module")
def engine() -> Engine:
    # A slow emulated link: copies take longer than a layer, so there are stalls to report.
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"), link_gbps=0.05)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(engine: Engine) -> list[int]:
    engine.configure("full")
    return engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=TOKENS)).token_ids


def test_buffer_keeps_the_newest_events_and_counts_the_dropped() -> None:
    buffer = EventBuffer(capacity=3)
    for index in range(5):
        buffer(TokenGenerated(index, index, 0.0))
    assert [event.index for event in buffer.drain()] == [2, 3, 4]
    assert buffer.dropped == 2
    assert buffer.drain() == []


def test_buffer_takes_events_from_one_thread_while_another_drains() -> None:
    buffer = EventBuffer(capacity=100_000)
    drained: list = []
    done = threading.Event()

    def consume() -> None:
        while not done.is_set():
            drained.extend(buffer.drain())
        drained.extend(buffer.drain())

    consumer = threading.Thread(target=consume)
    consumer.start()
    for index in range(20_000):
        buffer(TokenGenerated(index, 0, 0.0))
    done.set()
    consumer.join()
    assert [event.index for event in drained] == list(range(20_000))


def test_stream_accounts_for_every_access_copy_and_stall(engine: Engine, reference: list[int]) -> None:
    engine.configure("seqmoe", cache_ratio=0.3)
    buffer = EventBuffer()
    engine.events.subscribe(buffer)
    try:
        result = engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=TOKENS))
    finally:
        engine.events.unsubscribe(buffer)
    events = buffer.drain()
    stats = result.stats
    assert result.token_ids == reference
    kinds = Counter(type(event) for event in events)
    assert kinds[TokenGenerated] == stats.tokens
    decode = [e for e in events if isinstance(e, LayerRouted) and not e.prefill]
    assert len(decode) == (stats.tokens - 1) * engine.loaded.host.num_layers
    routings = [e for e in events if isinstance(e, LayerRouted)]
    assert sum(len(e.missed) for e in routings) == stats.misses and sum(len(e.late) for e in routings) == stats.late
    assert sum(len(e.experts) - len(e.missed) - len(e.late) for e in routings) == stats.hits
    assert kinds[PrefetchIssued] - kinds[PrefetchCancelled] == stats.prefetch_issued
    evicted_unused = sum(1 for e in events if isinstance(e, ExpertEvicted) and e.unused)
    assert evicted_unused + kinds[PrefetchUnused] == stats.prefetch_unused
    stalls = [e for e in events if isinstance(e, Stall)]
    assert stalls and {e.cause for e in stalls} <= {"miss", "late prefetch"}
    routed = None
    for event in events:  # a forecast is heard after the routing it was made from
        if isinstance(event, LayerRouted):
            routed = event.layer
        elif isinstance(event, ExpertsForecast):
            assert event.layer == routed
    assert sum(e.seconds for e in stalls) == pytest.approx(stats.stall_seconds, rel=1e-6)


def heard(engine: Engine, policy: str, tokens: int) -> list:
    """The events of one reply to ``PROMPT`` under ``policy`` at cache ratio 0.3, in order."""
    engine.configure(policy, cache_ratio=0.3)
    seen: list = []
    engine.events.subscribe(seen.append)
    try:
        engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=tokens))
    finally:
        engine.events.unsubscribe(seen.append)
    return seen


def test_snapshots_show_the_routed_experts_in_use(engine: Engine) -> None:
    seen = heard(engine, "lru", tokens=4)
    snapshots = [(i, e) for i, e in enumerate(seen) if isinstance(e, CacheSnapshot)]
    assert len(snapshots) > 1
    for position, snapshot in snapshots[:-1]:  # the last one is taken after the reply (next test)
        routed = next(e for e in reversed(seen[:position]) if isinstance(e, LayerRouted))
        assert routed.layer == snapshot.layer
        assert len(snapshot.owners) == engine.cache_slots
        in_use = {owner for owner, state in zip(snapshot.owners, snapshot.states) if state is SlotStatus.IN_USE}
        assert in_use == {(routed.layer, expert) for expert in routed.experts}
        empty = [owner for owner, state in zip(snapshot.owners, snapshot.states) if state is SlotStatus.EMPTY]
        assert all(owner is None for owner in empty)


def test_the_last_snapshot_shows_the_pool_as_the_reply_leaves_it(engine: Engine) -> None:
    # Prefetches are still queued when the reply ends on this slow link; they are cancelled then.
    seen = heard(engine, "seqmoe", tokens=6)
    last = max(i for i, e in enumerate(seen) if isinstance(e, CacheSnapshot))
    assert last > max(i for i, e in enumerate(seen) if isinstance(e, LayerRouted))
    assert any(isinstance(e, PrefetchCancelled) for e in seen[:last])
    snapshot, pool = seen[last], engine.cache.pool
    assert SlotStatus.IN_USE not in snapshot.states
    assert snapshot.owners == tuple(pool.owner)
    for slot, state in enumerate(snapshot.states):
        if state is SlotStatus.LOADING:  # only copies the link had started: the queued ones were cancelled
            assert pool.job[slot].state is not JobState.QUEUED


def test_resize_changes_the_slots_in_place_and_keeps_the_output(engine: Engine, reference: list[int]) -> None:
    engine.configure("seqmoe", cache_ratio=0.3)
    prompt = engine.encode(PROMPT, chat=True)
    engine.generate(prompt, Sampling(max_new_tokens=TOKENS))
    small = engine.cache_slots
    cache = engine.cache
    engine.resize(cache_ratio=0.6)
    assert engine.cache is cache and engine.cache_slots > small
    grown = engine.generate(prompt, Sampling(max_new_tokens=TOKENS))
    assert grown.token_ids == reference
    assert grown.stats.cache_slots == engine.cache_slots
    engine.resize(cache_ratio=0.2)
    assert engine.cache_slots < small
    assert engine.generate(prompt, Sampling(max_new_tokens=TOKENS)).token_ids == reference


def test_resize_keeps_the_most_recently_used_experts(engine: Engine) -> None:
    engine.configure("lru", cache_ratio=0.5)
    routed: list[LayerRouted] = []
    listener = lambda e: routed.append(e) if isinstance(e, LayerRouted) else None  # noqa: E731
    engine.events.subscribe(listener)
    try:
        engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=3))
    finally:
        engine.events.unsubscribe(listener)
    last = routed[-1]
    engine.resize(cache_ratio=0.2)
    kept = set(engine.cache.pool.slot_of)
    assert {(last.layer, expert) for expert in last.experts} <= kept
    assert len(kept) == engine.cache_slots


def test_resize_frees_the_old_pool(engine: Engine) -> None:
    engine.configure("seqmoe", cache_ratio=0.3)
    engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=3))
    old = [weakref.ref(tensor) for tensor in engine.cache.pool.tensors.values()]
    engine.resize(cache_ratio=0.6)
    gc.collect()
    # The copies' records (the link's last job, CUDA's in-flight and stall queues) hold no views of it.
    assert all(ref() is None for ref in old)


def test_a_closed_engine_gives_its_model_back_without_the_garbage_collector() -> None:
    """The app drops an unloaded engine on its worker thread, where a collection could finalise
    the GUI's Qt objects: the model's memory must come back by reference counting alone."""
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"), link_gbps=0.05)
    engine.configure("seqmoe", cache_ratio=0.3)
    gc.disable()
    try:
        engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=3))
        model = weakref.ref(engine.loaded.model)
        expert_pool = [weakref.ref(tensor) for tensor in engine.cache.pool.tensors.values()]
        engine.close()
        del engine
        assert model() is None and all(ref() is None for ref in expert_pool)
    finally:
        gc.enable()


def test_resize_below_the_minimum_is_refused_and_keeps_the_cache(engine: Engine) -> None:
    engine.configure("lru", cache_ratio=0.3)
    before = engine.cache_slots
    with pytest.raises(BudgetTooSmall, match="minimum"):
        engine.resize(cache_ratio=0.001)
    assert engine.cache_slots == before


def test_a_grow_the_device_has_no_memory_for_keeps_the_cache_and_its_experts(
    engine: Engine, reference: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.configure("lru", cache_ratio=0.3)
    prompt = engine.encode(PROMPT, chat=True)
    engine.generate(prompt, Sampling(max_new_tokens=3))
    before, kept = engine.cache_slots, dict(engine.cache.pool.slot_of)
    real = seqmoe.cache.SlotPool

    def pool(layout, size: int, device):  # noqa: ANN001
        if size > before:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(layout, size, device)

    monkeypatch.setattr(seqmoe.cache, "SlotPool", pool)
    with pytest.raises(BudgetTooSmall, match=f"ran out of memory .* keeps its {before} slots"):
        engine.resize(cache_ratio=0.6)
    assert engine.cache_slots == before and set(engine.cache.pool.slot_of) == set(kept)
    assert engine.generate(prompt, Sampling(max_new_tokens=TOKENS)).token_ids == reference


def reply_failing_in(engine: Engine, listener: Callable[[object], None]) -> None:
    """A reply that fails as ``listener``, which raises "a listener failed", hears its events."""
    engine.events.subscribe(listener)
    try:
        with pytest.raises(RuntimeError, match="a listener failed"):
            engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=TOKENS))
    finally:
        engine.events.unsubscribe(listener)


@pytest.mark.parametrize("failing", [LayerRouted, ExpertsForecast])
def test_a_generation_that_fails_inside_a_layer_leaves_none_of_its_slots_pinned(
    engine: Engine, reference: list[int], failing: type
) -> None:
    engine.configure("seqmoe", cache_ratio=0.3)
    seen = Counter()

    def listener(event: object) -> None:
        if isinstance(event, failing):
            seen[failing] += 1
            if seen[failing] == 20:  # in the reply, between a layer's acquire and its release
                raise RuntimeError("a listener failed")

    reply_failing_in(engine, listener)
    assert not any(engine.cache.pool.pins)
    assert engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=TOKENS)).token_ids == reference


def test_a_listener_that_fails_at_the_end_of_a_reply_leaves_the_prefetch_books_right(
    engine: Engine, reference: list[int]
) -> None:
    engine.configure("seqmoe", cache_ratio=0.3)

    def listener(event: object) -> None:
        if isinstance(event, PrefetchUnused):  # heard once the reply's tokens are all out
            raise RuntimeError("a listener failed")

    reply_failing_in(engine, listener)
    assert engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=TOKENS)).token_ids == reference
    # Each prefetch ends one way (the failed reply's unused ones were counted again by the next).
    prefetches = engine.cache.prefetches
    assert prefetches.used + prefetches.unused + prefetches.cancelled == prefetches.issued


def test_a_shorter_horizon_forecasts_fewer_layers_and_keeps_the_output(engine: Engine, reference: list[int]) -> None:
    prompt = engine.encode(PROMPT, chat=True)
    limit = engine.max_horizon()
    assert limit == 8, "the bundled predictor forecasts a whole token (eight MoE layers) ahead"
    seen: dict[int | None, set[int]] = {}
    for horizon in (None, 1):
        engine.horizon = horizon
        engine.configure("seqmoe", cache_ratio=0.3)
        assert engine.forecast_horizon == (limit if horizon is None else 1)
        forecasts: list = []
        listener = lambda e: forecasts.append(e) if isinstance(e, ExpertsForecast) else None  # noqa: E731
        engine.events.subscribe(listener)
        try:
            assert engine.generate(prompt, Sampling(max_new_tokens=TOKENS)).token_ids == reference
        finally:
            engine.events.unsubscribe(listener)
        seen[horizon] = {(key[0] - e.layer) % engine.loaded.host.num_layers for e in forecasts for key, _ in e.probabilities}
    engine.horizon = None
    assert seen[1] == {1}
    assert max(seen[None]) > 1


def test_a_listener_hears_each_event_once_and_leaving_twice_is_harmless() -> None:
    from seqmoe.events import EventBus, TokenGenerated

    bus, heard = EventBus(), []
    bus.subscribe(heard.append)
    bus.subscribe(heard.append)  # a bound method made again is the same listener
    bus.emit(TokenGenerated(0, 1, 0.1))
    bus.unsubscribe(heard.append)
    bus.unsubscribe(heard.append)
    bus.emit(TokenGenerated(1, 2, 0.2))
    assert heard == [TokenGenerated(0, 1, 0.1)] and not bus.active
    with pytest.raises(TypeError, match="cannot be called"):
        bus.subscribe(42)
