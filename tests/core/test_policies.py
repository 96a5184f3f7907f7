"""Eviction rules of the modified Belady policy, admission, the oracle, and a stress test."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch

from seqmoe.cache import LAYER_TIME_SMOOTHING, ExpertCache
from seqmoe.events import EventBus, ExpertEvicted, LayerRouted, PrefetchUnused
from seqmoe.policies import (
    DISCOUNT_TOKENS,
    LATER_DISCOUNT,
    NEAR,
    BeladyPolicy,
    Forecast,
    GatePolicy,
    OraclePolicy,
    Policy,
    RouterSeqMoEPolicy,
    SeqMoEPolicy,
    flat_indices,
)
from seqmoe.reliability import Reliability
from seqmoe.simulate import SimulatedCopier, VirtualClock
from seqmoe.store import HostStore, SlotState
from seqmoe.transfer import CopyJob, EmulatedCopier, JobState, MeasuredStall, take_queued

from .test_cache import FakeExperts

LAYERS, EXPERTS = 4, 4


def victim(policy: Policy, candidates: list[tuple[int, int]]) -> tuple[int, int]:
    """The first of ``candidates`` that ``policy`` evicts."""
    return next(policy.eviction_order(flat_indices(candidates, policy.num_experts)))


def belady(prior: float = 0.25) -> BeladyPolicy:
    return BeladyPolicy(LAYERS, torch.full((LAYERS, EXPERTS), prior))


def test_farthest_expected_use_is_evicted() -> None:
    policy = belady()
    policy.observe(0, [0])
    policy.remember([Forecast((1, 0), 0.9, 1), Forecast((2, 0), 0.9, 2)], {1, 2})
    # Same probability: layer 2 comes one layer later than layer 1.
    assert policy.distance((2, 0)) == pytest.approx(policy.distance((1, 0)) + 1)
    # Layer 3 is beyond the forecast: its prior (0.25) is both the chance of its layer's next run
    # and the rate after it, V = 0.25 + 0.75 * 0.25 g / (1 - 0.75 g), g = exp(-1 / 2).
    g = LATER_DISCOUNT
    value = 0.25 + 0.75 * 0.25 * g / (1 - 0.75 * g)
    assert policy.distance((3, 0)) == pytest.approx(3 - DISCOUNT_TOKENS * LAYERS * math.log(value))
    assert victim(policy, [(1, 0), (2, 0), (3, 0)]) == (3, 0)


def test_a_certain_use_is_ranked_by_its_distance_alone() -> None:
    policy = belady()
    policy.observe(0, [0])
    policy.remember([Forecast((2, 0), 1.0, 2)], {2})
    assert policy.distance((2, 0)) == pytest.approx(2)


def test_a_likely_use_next_token_outlives_an_unlikely_one_though_its_expected_distance_is_longer() -> None:
    """Expected distance is set by its far tail: (2, 0), 30% likely next token but rarely used
    beyond it, would average 100 tokens away and go before (2, 1), unlikely either way."""
    prior = torch.full((LAYERS, EXPERTS), 0.25)
    prior[2, 0], prior[2, 1] = 0.01, 0.1
    policy = BeladyPolicy(LAYERS, prior)
    policy.observe(0, [0])
    policy.remember([Forecast((2, 0), 0.3, 2), Forecast((2, 1), 0.05, 2)], {2})
    assert victim(policy, [(2, 0), (2, 1)]) == (2, 1)


def test_a_forecast_past_one_token_gives_each_layer_its_next_run() -> None:
    """With a horizon above the layer count a layer comes twice; its next run's probability counts."""
    policy = belady()
    policy.observe(0, [0])
    forecasts = [Forecast((1, 0), 0.9, 1), Forecast((1, 0), 0.1, 1 + LAYERS)]
    for order in (forecasts, forecasts[::-1]):
        policy.remember(order, {1})
        assert policy.probability((1, 0)) == pytest.approx(0.9)


def test_near_equal_distances_evict_the_lower_probability() -> None:
    policy = belady()
    policy.observe(0, [0])
    # (1, 1): one layer away with p=0.5 -> 1 + 3.58 = 4.58; (2, 1): two layers away with p=0.6 -> 2 + 2.72 = 4.72
    policy.remember([Forecast((1, 1), 0.5, 1), Forecast((2, 1), 0.6, 2)], {1, 2})
    assert policy.distance((2, 1)) - policy.distance((1, 1)) < 0.5
    assert victim(policy, [(1, 1), (2, 1)]) == (1, 1)


def test_equal_scores_evict_the_least_recently_used() -> None:
    policy = belady()
    policy.observe(3, [2])
    policy.observe(3, [1])
    policy.observe(0, [0])
    assert victim(policy, [(3, 1), (3, 2)]) == (3, 2)


@pytest.mark.parametrize("seed", range(20))
def test_the_eviction_order_is_the_victim_rule_applied_again_and_again(seed: int) -> None:
    """Belady's order, built once per re-plan, against its rule applied to what is left each time:
    the farthest, then within ``NEAR`` of it the least probable, then the least recently used."""
    rng = random.Random(seed)
    layers, experts = 4, 8
    prior = torch.tensor([[rng.choice((0.05, 0.2, 0.21, 0.5)) for _ in range(experts)] for _ in range(layers)])
    policy = BeladyPolicy(layers, prior)
    for step in range(rng.randint(1, 12)):
        policy.observe(step % layers, rng.sample(range(experts), 2))
    ahead = [(policy.layer + h) % layers for h in (1, 2)]
    policy.remember([Forecast((j, e), rng.choice((0.1, 0.3, 0.32, 0.9)), h) for h, j in enumerate(ahead, 1)
                     for e in rng.sample(range(experts), 3)], set(ahead))
    candidates = rng.sample([(j, e) for j in range(layers) for e in range(experts)], 20)

    left, expected = list(candidates), []
    while left:
        farthest = max(policy.distance(key) for key in left)
        near = [key for key in left if policy.distance(key) >= farthest - NEAR]
        expected.append(min(near, key=lambda key: (policy.probability(key), policy.recency(key), key)))
        left.remove(expected[-1])
    assert list(policy.eviction_order(flat_indices(candidates, experts))) == expected


def test_a_distance_asked_before_news_is_asked_again_after_it() -> None:
    """Eviction keeps the distances a re-plan asks for; a forecast, a reuse forecast or a use since
    then moves them."""
    soon = np.full((LAYERS, EXPERTS), LATER_DISCOUNT)
    policy = SeqMoEPolicy(lambda h, l, r: torch.zeros(1, EXPERTS), LAYERS, torch.full((LAYERS, EXPERTS), 0.25),
                          stride=1, reuse=lambda hidden, rate, age, discount: soon)
    policy.observe(0, [0])
    unknown = policy.distance((1, 2))
    policy.remember([Forecast((1, 2), 0.9, 1)], {1})
    forecast = policy.distance((1, 2))
    assert forecast < unknown
    for layer in (1, 2, 3):  # the token's last layer makes the reuse forecast: "back within a token"
        policy.observe(layer, [0])
        before = policy.distance((2, 3))
        policy.forecast(layer, torch.zeros(4), torch.tensor([0]))
    assert policy.distance((2, 3)) < before
    before = policy.distance((0, 1))
    policy.observe(0, [1])
    assert policy.distance((0, 1)) != before


def test_an_expert_in_steady_use_outlives_a_recent_one_forecast_as_unlikely() -> None:
    policy = belady(prior=0.1)
    for token in range(9):  # layer 2 used expert 1 for eight tokens, then expert 2 once
        for layer in range(LAYERS):
            policy.observe(layer, ([1] if token < 8 else [2]) if layer == 2 else [0])
    policy.remember([Forecast((2, 1), 0.05, 3), Forecast((2, 2), 0.05, 3)], {2})
    # Same forecast for the next token; beyond it expert 1's rate of use brings it back sooner.
    assert policy.distance((2, 1)) < policy.distance((2, 2)) - 4
    assert victim(policy, [(2, 1), (2, 2)]) == (2, 2)  # LRU alone would evict expert 1


def test_an_oracle_seeing_one_token_ahead_ranks_later_uses_as_unknown() -> None:
    future = [(0, frozenset({0})), (1, frozenset({1})), (0, frozenset({2})), (1, frozenset({3})), (0, frozenset({0}))]
    oracle, limited = OraclePolicy(future, 2, EXPERTS, horizon=1), OraclePolicy(future, 2, EXPERTS, horizon=1, lookahead=2)
    for policy in (oracle, limited):
        policy.observe(0, [0])
        policy.observe(1, [1])
    assert limited.distance((0, 2)) == 1 and limited.distance((1, 3)) == 2
    assert oracle.distance((0, 0)) == 3 and limited.distance((0, 0)) == float("inf")  # beyond its sight


def test_oracle_evicts_the_expert_used_last() -> None:
    future = [(0, frozenset({0})), (1, frozenset({1})), (2, frozenset({2})), (1, frozenset({3}))]
    oracle = OraclePolicy(future, LAYERS, EXPERTS, horizon=2)
    oracle.observe(0, [0])
    assert oracle.distance((2, 2)) == 2 and oracle.distance((1, 3)) == 3 and oracle.distance((3, 3)) == float("inf")
    assert victim(oracle, [(1, 1), (2, 2), (1, 3)]) == (1, 3)
    assert [f.key for f in oracle.forecast(0, torch.zeros(1), torch.zeros(1))] == [(1, 1), (2, 2)]


def test_the_oracle_runs_past_the_end_of_its_future_seeing_nothing() -> None:
    """A generation may run longer than the recorded one: the oracle then knows no more uses."""
    future = [(step % LAYERS, frozenset({1})) for step in range(LAYERS + 2)]
    oracle = OraclePolicy(future, LAYERS, EXPERTS)
    for step in range(LAYERS):
        oracle.observe(step % LAYERS, [1])
    assert [f.key for f in oracle.forecast(LAYERS - 1, torch.zeros(1), torch.zeros(1))] == [(0, 1), (1, 1)]
    for step in range(3):
        oracle.observe(step % LAYERS, [1])
    assert len(oracle.forecast(2, torch.zeros(1), torch.zeros(1))) == 0
    assert oracle.distance((0, 1)) == oracle.distance((3, 1)) == float("inf")


def test_the_oracle_forecasts_the_next_four_tokens() -> None:
    future = [(step % LAYERS, frozenset({step % EXPERTS})) for step in range(6 * LAYERS)]
    oracle = OraclePolicy(future, LAYERS, EXPERTS)
    oracle.observe(0, [0])
    forecast = oracle.forecast(0, torch.zeros(1), torch.zeros(1))
    assert [f.horizon for f in forecast] == list(range(1, 4 * LAYERS + 1))
    assert [f.key for f in forecast] == [(s % LAYERS, s % EXPERTS) for s in range(1, 4 * LAYERS + 1)]
    next_only = OraclePolicy(future, LAYERS, EXPERTS, lookahead=LAYERS)  # oracle-next: one token, no further
    next_only.observe(0, [0])
    assert max(f.horizon for f in next_only.forecast(0, torch.zeros(1), torch.zeros(1))) == LAYERS


def fake_host() -> HostStore:
    return HostStore([FakeExperts(layer, EXPERTS) for layer in range(LAYERS)], pinned=None)


def unused_routers() -> list[torch.nn.Module]:
    """Routers for a gate policy whose forecasts a test passes to ``plan`` itself."""
    return [torch.nn.Linear(2, EXPERTS) for _ in range(LAYERS)]


def make_cache(size: int, policy: Policy, gbps: float = 50.0) -> ExpertCache:
    copier = EmulatedCopier(gbytes_per_s=gbps, latency_s=0.0)
    return ExpertCache(fake_host(), size=size, device=torch.device("cpu"), copier=copier, policy=policy, events=EventBus())


def virtual_cache(
    size: int, policy: Policy, clock: VirtualClock, seconds_per_copy: float,
    link: Callable[[VirtualClock, float, int], SimulatedCopier] = SimulatedCopier,
) -> ExpertCache:
    """A cache on the simulator's link: copies take ``seconds_per_copy`` of ``clock``'s time."""
    host = fake_host()
    copier = link(clock, seconds_per_copy, host.layout.bytes_per_expert)
    return ExpertCache(host, size, torch.device("cpu"), copier, policy, EventBus(), clock=clock)


def test_admission_refuses_a_prefetch_needed_later_than_its_victim() -> None:
    policy = belady(prior=0.01)
    cache = make_cache(2, policy)
    for expert in (0, 1):
        cache.release(cache.acquire(1, [expert], prefill=False))
    policy.remember([Forecast((1, 0), 0.9, 1), Forecast((1, 1), 0.9, 1), Forecast((2, 3), 0.05, 2)], {1, 2})
    cache.plan([Forecast((2, 3), 0.05, 2)])
    assert (2, 3) not in cache.pool.slot_of and cache.prefetches.issued == 0
    policy.remember([Forecast((1, 0), 0.01, 1), Forecast((1, 1), 0.9, 1), Forecast((2, 3), 0.95, 1)], {1, 2})
    cache.plan([Forecast((2, 3), 0.95, 1)])
    assert (2, 3) in cache.pool.slot_of and (1, 0) not in cache.pool.slot_of
    cache.copier.close()


def test_the_busier_the_link_the_likelier_a_prefetch_must_be() -> None:
    cache = make_cache(4, belady())
    assert cache.worth_prefetching() == 0.0  # idle link: any forecast is worth a copy
    cache.link_load = 1.0
    assert cache.worth_prefetching() == pytest.approx(0.5)
    assert cache.worth_prefetching(victim_reuse=1.0) == pytest.approx(2 / 3)
    cache.link_load = 9.0  # asked for nine times what it carries
    assert cache.worth_prefetching() == pytest.approx(0.9)
    cache.release(cache.acquire(0, [0], prefill=False))
    cache.plan([Forecast((1, 2), 0.95, 1), Forecast((1, 3), 0.85, 1)])
    assert (1, 2) in cache.pool.slot_of and (1, 3) not in cache.pool.slot_of
    cache.copier.close()


def test_gate_loads_every_guess_as_mixtral_offloading_does() -> None:
    cache = make_cache(3, GatePolicy(unused_routers(), EXPERTS, top_k=2))
    cache.link_load = 9.0  # seqmoe's admission would refuse anything below 0.9 here
    cache.release(cache.acquire(0, [0], prefill=False))
    cache.plan([Forecast((1, 2), 0.3, 1), Forecast((1, 3), 0.2, 1)])
    assert (1, 2) in cache.pool.slot_of and (1, 3) in cache.pool.slot_of and cache.prefetches.issued == 2
    cache.copier.close()


def test_gate_evicts_none_of_its_guesses_to_load_another() -> None:
    cache = make_cache(3, GatePolicy(unused_routers(), EXPERTS, top_k=2))
    for layer, expert in [(1, 0), (2, 1)]:
        cache.release(cache.acquire(layer, [expert], prefill=False))
    slots = cache.acquire(0, [2], prefill=False)
    # (1, 0) is the least recently used expert here, and one of the two guesses for layer 1.
    cache.plan([Forecast((1, 0), 0.9, 1), Forecast((1, 3), 0.8, 1)])
    cache.release(slots)
    assert {(1, 0), (1, 3)} <= set(cache.pool.slot_of) and (2, 1) not in cache.pool.slot_of
    cache.copier.close()


def test_a_re_plan_that_cancels_many_copies_does_not_close_the_link_to_certain_ones() -> None:
    clock = VirtualClock()
    cache = virtual_cache(14, belady(), clock, seconds_per_copy=100.0)
    for slot, layer in enumerate(range(LAYERS)):
        cache.pool.assign(slot, (layer, 0), None)
    steps = [
        [],
        [Forecast((layer, expert), 0.9, 2) for layer in (2, 3) for expert in (1, 2, 3)],  # on a link still idle
        [],  # the next layer's re-plan cancels all those that have not started
    ]
    for layer, forecasts in enumerate(steps):
        cache.release(cache.acquire(layer, [0], prefill=False))
        cache.plan(forecasts)
        clock.now += 1.0
    issued = cache.prefetches.issued
    cache.release(cache.acquire(3, [0], prefill=False))
    cache.plan([Forecast((0, 1), 1.0, 1)])
    assert cache.prefetches.issued == issued + 1


def test_link_load_is_copy_time_per_second_of_compute_stalls_excluded() -> None:
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=4.0)
    cache.release(cache.acquire(0, [0], prefill=False))  # a miss: 4 s of stall
    clock.now += 1.0  # the layer computes for 1 s
    cache.release(cache.acquire(1, [1], prefill=False))
    # One 4 s copy per second of compute; over the 5 s the layer took it would look like 0.8.
    assert cache.link_load == pytest.approx(4.0)


class StallsReadLate(SimulatedCopier):
    """CUDA's way with stalls: one can be read once the GPU has passed it, which the host learns
    only as it moves on (at the next layer's routing), not while the clock still reads the wait's end."""

    blocks_host = False

    def __init__(self, clock: VirtualClock, seconds_per_copy: float, expert_bytes: int) -> None:
        super().__init__(clock, seconds_per_copy, expert_bytes)
        self._waited_until = -math.inf

    def wait(self, job: CopyJob, phase: str = "decode") -> None:
        super().wait(job, phase)
        self._waited_until = self.clock.now

    def take_stalls(self) -> list[MeasuredStall]:
        return super().take_stalls() if self.clock.now > self._waited_until else []


@pytest.mark.parametrize("link", [SimulatedCopier, StallsReadLate])
def test_a_stall_read_a_layer_late_is_charged_to_the_layer_that_waited(link) -> None:
    # Charged to the next layer, the layer that waited seemed to compute for all its 5 s (a load of
    # 0.8, not 4) and the next for 1e-6 s, where one copy asked for reads as a load in the millions.
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=4.0, link=link)
    for slot, layer in enumerate((1, 2)):
        cache.pool.assign(slot, (layer, 0), None)
    loads = []
    for layer in range(3):  # a miss (4 s of stall), then two hits
        cache.release(cache.acquire(layer, [0], prefill=False))
        clock.now += 1.0  # each layer computes for 1 s
        loads.append(cache.link_load)
    assert loads[1:] == pytest.approx([4.0, 4.0 + LAYER_TIME_SMOOTHING * (0.0 - 4.0)])


def test_the_cache_tells_its_policy_how_long_decode_layers_take_and_wait_for_copies() -> None:
    clock = VirtualClock()
    policy = SeqMoEPolicy(lambda h, l, r: torch.zeros(1, EXPERTS), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    cache = virtual_cache(4, policy, clock, seconds_per_copy=4.0)
    cache.release(cache.acquire(0, [0], prefill=False))  # a miss: 4 s of stall
    clock.now += 1.0
    cache.release(cache.acquire(1, [0], prefill=False))  # a hit
    # The layer took 5 s, 4 of them waiting: 5% of 1 s of compute, and the 4 s.
    assert policy.budget == pytest.approx(0.05 * 1.0 + 4.0)


def test_the_look_ahead_runs_while_the_layers_misses_are_on_their_way() -> None:
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=4.0)
    arrived = []

    def look_ahead() -> None:
        arrived.append(cache.copier.done(cache.pool.job[cache.pool.slot_of[(0, 0)]]))

    cache.release(cache.acquire(0, [0], prefill=False, meanwhile=look_ahead))
    assert arrived == [False]
    assert clock.now == pytest.approx(4.0)  # and the layer waited for the copy after it


@pytest.mark.parametrize(
    ("look_ahead_seconds", "budget"),
    [
        # A miss of 4 s; looking ahead for 1 s leaves 3 s of wait: the layer waited 4 s for the
        # link, 1 s of compute: 5% of 1 s, and the 4 s.
        (1.0, 0.05 * 1.0 + 4.0),
        # Looking ahead for 5 s outlasts the copy: no wait, 6 s of host time and compute.
        (5.0, 0.05 * 6.0),
    ],
)
def test_a_look_ahead_that_fills_a_wait_counts_as_waiting_for_the_link(look_ahead_seconds: float, budget: float) -> None:
    clock = VirtualClock()
    policy = SeqMoEPolicy(lambda h, l, r: torch.zeros(1, EXPERTS), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    cache = virtual_cache(4, policy, clock, seconds_per_copy=4.0)

    def look_ahead() -> None:
        clock.now += look_ahead_seconds

    cache.release(cache.acquire(0, [0], prefill=False, meanwhile=look_ahead))
    clock.now += 1.0
    cache.release(cache.acquire(1, [0], prefill=False))
    assert policy.budget == pytest.approx(budget)


def test_the_cache_tells_its_policy_what_a_plan_of_copies_costs_on_the_host() -> None:
    clock = VirtualClock()
    seen = []

    class Timed(SeqMoEPolicy):
        def eviction_order(self, candidates):
            clock.now += 0.25  # ranking the victims is host time spent planning
            return super().eviction_order(candidates)

        def observe_timing(
            self, layer_seconds: float, stall_seconds: float, plan_seconds: float = 0.0, link_load: float = math.inf
        ) -> None:
            seen.append(plan_seconds)
            super().observe_timing(layer_seconds, stall_seconds, plan_seconds, link_load)

    policy = Timed(lambda h, l, r: torch.zeros(1, EXPERTS), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    cache = virtual_cache(4, policy, clock, seconds_per_copy=0.01)
    cache.release(cache.acquire(0, [0], prefill=False))
    cache.plan([Forecast((1, 1), 0.9, 1)])
    clock.now += 1.0
    cache.release(cache.acquire(1, [1], prefill=False))
    assert seen[-1] == pytest.approx(0.25)


def test_planned_prefetch_turns_the_next_layer_into_a_hit() -> None:
    policy = belady()
    cache = make_cache(4, policy)
    cache.release(cache.acquire(0, [0, 1], prefill=False))
    cache.plan([Forecast((1, 2), 0.9, 1), Forecast((1, 3), 0.8, 1)])
    time.sleep(0.01)
    slots = cache.acquire(1, [2, 3], prefill=False)
    assert cache.phases["decode"].misses == 2 and cache.phases["decode"].hits == 2
    assert cache.prefetches.issued == 2 and cache.prefetches.used == 2
    assert [cache.pool.tensors["gate_up_proj"][s][0, 0].item() for s in slots] == [102.0, 103.0]
    cache.release(slots)
    cache.copier.close()


@pytest.mark.parametrize("size", range(2, 11))
def test_no_expert_in_use_is_ever_evicted_under_random_forecasts(size: int) -> None:
    """Random routing and random forecasts on caches of every small size, with a prefill pass
    streaming every few tokens: every acquired slot holds the right weights for as long as its
    layer runs, whatever the prefetches and streamed copies do."""
    rng = random.Random(size)
    policy = random_forecasts(seed=size)
    cache = make_cache(size, policy, gbps=0.05)
    run_random_chat(cache, policy, rng, pause=lambda: time.sleep(rng.random() * 0.002))
    # With two slots both are pinned by the running layer: there is never room to prefetch.
    assert (cache.prefetches.issued > 0) == (size > 2)
    cache.copier.close()


class JitteryLink(SimulatedCopier):
    """A link on the virtual clock that may have moved on whenever it is asked anything: copies
    start and land between any two of the cache's looks, as a link thread or a CUDA stream's may."""

    def __init__(self, clock: VirtualClock, seconds_per_copy: float, expert_bytes: int, rng: random.Random) -> None:
        super().__init__(clock, seconds_per_copy, expert_bytes)
        self.rng = rng

    def _settle(self) -> None:
        self.clock.now += self.rng.choice((0.0, 0.0, 0.0, 0.2, 0.6, 1.5)) * self.copy_seconds
        super()._settle()


@pytest.mark.parametrize("size", range(4, 11))
def test_the_cache_keeps_its_books_whenever_the_link_moves_on(size: int) -> None:
    """The random chat of the test above on a link that jumps ahead at every question: no
    interleaving of copies and looks crashes the cache, loses an expert's weights, or leaves a
    victim waiting for a prefetch that has gone. (From four slots up, re-plans find queued
    prefetches to cancel; with three, the one slot left over goes straight onto an idle link.)"""
    rng = random.Random(size)
    policy = random_forecasts(seed=size)
    clock = VirtualClock()
    cache = virtual_cache(size, policy, clock, seconds_per_copy=3.0, link=partial(JitteryLink, rng=random.Random(size)))
    run_random_chat(cache, policy, rng, pause=lambda: setattr(clock, "now", clock.now + rng.random()))
    assert cache.prefetches.issued > 0 and cache.prefetches.cancelled > 0
    cache.end_of_generation()
    clock.now += 100.0  # every copy on its way lands
    cache.release(cache.acquire(0, [0, 1], prefill=False))
    # The books behind "a cancelled prefetch gives its slot back": nothing is left queued, so
    # no expert may still count as displaced by a queued prefetch.
    assert not cache._queued and not cache._displaced_by and not cache._displaced


def random_forecasts(seed: int) -> SeqMoEPolicy:
    """Forecasts of three layers ahead, each expert's probability drawn at random."""
    generator = torch.Generator().manual_seed(seed)
    return SeqMoEPolicy(lambda h, l, r: torch.rand(3, EXPERTS, generator=generator), LAYERS,
                        torch.full((LAYERS, EXPERTS), 0.3), 0.0)


def run_random_chat(cache: ExpertCache, policy: SeqMoEPolicy, rng: random.Random, pause) -> None:
    """160 layers of random routing, a prefill pass streaming every fifth token; after each layer,
    ``pause`` (the layer's compute), then its slots must hold its experts and the slot table agree."""
    size = cache.size
    for step in range(160):
        layer = step % LAYERS
        prefill = step // LAYERS % 5 == 4
        if prefill and layer == 0:
            cache.end_of_generation()  # a reply ended; the next prompt comes
        experts = sorted(rng.sample(range(EXPERTS), rng.randint(2, min(size, EXPERTS)) if prefill else 2))
        slots = cache.acquire(layer, experts, prefill=prefill)
        if prefill:
            policy.look_past_prompt(layer, torch.zeros(1), torch.tensor(experts))
            if layer + 1 < LAYERS:
                cache.stream(layer + 1, policy.stream_order(layer + 1))
        else:
            cache.plan(policy.forecast(layer, torch.zeros(1), torch.tensor(experts)))
        # Victims are chosen among the cache's candidates: none may be pinned or receiving a copy
        # (asked first: a link may finish a copy meanwhile, never start one by itself).
        candidates = set(cache._candidates().tolist())
        pool = cache.pool
        busy = [pool.owner[s] for s in range(size) if pool.pins[s] or pool.state(s) is SlotState.LOADING]
        assert not candidates & set(flat_indices(busy, EXPERTS).tolist())
        pause()
        values = [cache.pool.tensors["down_proj"][s][0, 0].item() for s in slots]
        assert values == [100.0 * layer + e for e in experts], f"cache of {size}, step {step}"
        owners = [key for key in cache.pool.owner if key is not None]
        assert len(set(owners)) == len(owners) and all(cache.pool.owner[s] == k for k, s in cache.pool.slot_of.items())
        cache.release(slots)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_expensive_predictor_runs_every_few_layers_within_its_budget() -> None:
    clock = _Clock()
    horizon = 3

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += 1.0  # one call costs 1; a layer 10: stride ceil(1 / (0.05 * 10)) = 2
        return torch.full((horizon, EXPERTS), 0.5)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock)
    seen = []
    for step in range(24):
        layer = step % LAYERS
        policy.observe_timing(10.0, 0.0)
        policy.observe(layer, [0])
        calls = policy.calls
        forecasts = policy.forecast(layer, torch.zeros(4), torch.tensor([0]))
        seen.append((layer, policy.calls > calls, forecasts))
    assert policy.stride == 2
    called = [made for _, made, _ in seen[-8:]]
    assert called.count(True) == 4, "every other layer once the costs are measured"
    for layer, made, forecasts in seen[-8:]:
        # A reused forecast has lost the layer that just ran: it starts at the next layer.
        assert min(f.horizon for f in forecasts) == 1
        assert {f.key[0] for f in forecasts if f.horizon == 1} == {(layer + 1) % LAYERS}
        assert max(f.horizon for f in forecasts) == (horizon if made else horizon - 1)


def test_the_reuse_forecast_takes_its_share_of_the_budget_first() -> None:
    clock = _Clock()

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += 0.5  # alone: stride ceil(0.5 / (0.05 * 10)) = 1
        return torch.full((3, EXPERTS), 0.5)

    def reuse(hidden: torch.Tensor, rate: np.ndarray, age: np.ndarray, discount: float) -> np.ndarray:
        clock.now += 1.0  # once a token: 0.25 per layer of the 0.5 a layer may spend
        return np.full((LAYERS, EXPERTS), discount)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock, reuse=reuse)
    for step in range(24):
        policy.observe_timing(10.0, 0.0)
        policy.observe(step % LAYERS, [0])
        policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
    assert policy.stride == 2  # ceil(0.5 / (0.5 - 0.25))
    assert policy.reuse_seconds == pytest.approx(6.0)  # every token's last layer


def test_an_expert_used_since_the_reuse_forecast_is_ranked_by_its_rate() -> None:
    def reuse(hidden: torch.Tensor, rate: np.ndarray, age: np.ndarray, discount: float) -> np.ndarray:
        return np.full((LAYERS, EXPERTS), 1e-3)  # "not back soon", for every expert

    policy = SeqMoEPolicy(_first_reply_predictor(3), LAYERS, torch.full((LAYERS, EXPERTS), 0.3), stride=1, reuse=reuse)
    for layer in range(LAYERS):  # one token; its last layer makes the reuse forecast
        policy.observe(layer, [0])
        policy.forecast(layer, torch.zeros(4), torch.tensor([0]))
    policy.observe(0, [1])  # the next token's first layer uses (0, 1), which the forecast did not know
    later = policy.later_values()
    assert later[0, 2] == pytest.approx(1e-3)
    rate = policy.recent_rates()[0, 1]
    assert later[0, 1] == pytest.approx(rate * LATER_DISCOUNT / (1 - (1 - rate) * LATER_DISCOUNT)) and later[0, 1] > 0.1


def test_a_reuse_forecast_dearer_than_half_the_budget_runs_every_few_tokens() -> None:
    clock = _Clock()
    calls = []

    def reuse(hidden: torch.Tensor, rate: np.ndarray, age: np.ndarray, discount: float) -> np.ndarray:
        clock.now += 3.0  # half the budget of a token is 0.05 * 10 * 4 / 2 = 1
        calls.append(policy._clock)
        return np.full((LAYERS, EXPERTS), 0.25)

    policy = SeqMoEPolicy(lambda h, l, r: torch.full((3, EXPERTS), 0.5), LAYERS, torch.full((LAYERS, EXPERTS), 0.3),
                          clock=clock, reuse=reuse)
    for step in range(10 * LAYERS):
        policy.observe_timing(10.0, 0.0)
        policy.observe(step % LAYERS, [0])
        policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
        if step == 9 * LAYERS - 2:  # two tokens after the last forecast, within its three
            assert policy.later_values()[1, 1] == 0.25
    assert policy.reuse_stride == 3
    assert [b - a for a, b in zip(calls, calls[1:])] == [3 * LAYERS] * (len(calls) - 1)


def test_a_cheap_predictor_runs_at_every_layer() -> None:
    policy = SeqMoEPolicy(lambda h, l, r: torch.full((2, EXPERTS), 0.5), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    for step in range(12):
        policy.observe_timing(0.01, 0.0)
        policy.observe(step % LAYERS, [0])
        policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
    assert policy.stride == 1 and policy.calls == 12


def test_a_predictor_dearer_than_its_share_runs_at_every_layer_while_the_layers_wait_for_the_link() -> None:
    clock = _Clock()

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += 1.0  # 0.05 of a layer of 10 is 0.5: alone, every other layer
        return torch.full((3, EXPERTS), 0.5)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock)
    for stall, stride in ((4.0, 1), (0.0, 2), (0.4, 2), (0.6, 1)):  # budget 0.05 * (10 - stall) + stall
        for step in range(4 * LAYERS):
            if step == 2 * LAYERS:  # settled
                calls = policy.calls
            policy.observe_timing(10.0, stall)
            policy.observe(step % LAYERS, [0])
            policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
        assert policy.stride == stride
        assert policy.calls - calls == 2 * LAYERS // stride


def test_the_look_ahead_spends_no_more_than_the_link_time_it_could_save() -> None:
    """On a link whose copies cost a layer less than the look-ahead would, looking ahead cannot pay
    for itself: the budget beyond the wait is the link time the layer asks for, if that is less."""
    clock = _Clock()

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += 0.125  # within 0.05 of a layer of 10: every layer, on a busy link
        return torch.full((3, EXPERTS), 0.5)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock)
    for load, stride in ((1.0, 1), (1 / 320, 4), (0.0, 125_000_000)):  # budget min(0.05, load) * 10: 0.5, 1/32, ~0
        for step in range(4 * LAYERS):
            policy.observe_timing(10.0, 0.0, 0.0, load)
            policy.observe(step % LAYERS, [0])
            policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
        assert policy.stride == stride
    calls = policy.calls
    for step in range(4 * LAYERS):  # the link is asked for copies again
        policy.observe_timing(10.0, 0.0, 0.0, 1.0)
        policy.observe(step % LAYERS, [0])
        policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
    assert policy.calls - calls == 4 * LAYERS


@pytest.mark.parametrize(
    ("call", "plan", "replans_between"),
    [
        # A layer of 10 without stalls: a budget of 0.5 a layer. A call and its plan, 0.25 + 0.75,
        # every other layer (ceil(1 / 0.5)); a plan between would cost 0.75 more: it does not fit.
        # A link whose copies cost less than planning them.
        (0.25, 0.75, False),
        # 0.75 + 0.1 every other layer; 0.425 + 0.05 with the plan between: it fits.
        (0.75, 0.1, True),
    ],
)
def test_the_layers_between_forecasts_re_plan_only_if_the_budget_has_room(call: float, plan: float, replans_between: bool) -> None:
    clock = _Clock()

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += call
        return torch.full((LAYERS, EXPERTS), 0.5)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock)
    policy.reliability = Reliability(prior=math.inf)  # the forecasts stand as made, whatever is routed
    planned = []
    for step in range(6 * LAYERS):
        policy.observe_timing(10.0, 0.0, plan)
        policy.observe(step % LAYERS, [0])
        calls = policy.calls
        forecasts = policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
        planned.append((policy.calls > calls, len(forecasts) > 0))
    assert (policy.stride, policy.replans_between) == (2, replans_between)
    assert planned[-8:] == [(True, True), (False, replans_between)] * 4
    # Eviction ranks by the rest of the last forecast either way: the next layer's experts at 0.5.
    assert policy.probability(((step + 1) % LAYERS, 1)) == pytest.approx(0.5)


def test_a_look_ahead_dearer_than_a_tokens_budget_forecasts_less_than_once_a_token() -> None:
    clock = _Clock()

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        clock.now += 2.0
        return torch.full((2, EXPERTS), 0.9)

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.3), clock=clock)
    policy.reliability = Reliability(prior=math.inf)  # the forecasts stand as made, whatever is routed
    calls, seen = [], []
    for step in range(8 * LAYERS):
        policy.observe_timing(10.0, 0.0, 1.0)  # a call and its plan, 3, against 0.5 a layer
        policy.observe(step % LAYERS, [0])
        made = policy.calls
        policy.forecast(step % LAYERS, torch.zeros(4), torch.tensor([0]))
        if policy.calls > made:
            calls.append(step)
        nearest = ((step + 1) % LAYERS, 1)
        seen.append((step - calls[-1], policy.probability(nearest), policy.recent_rates()[nearest]))
    assert policy.stride == 6 and calls[-3:] == [18, 24, 30]  # past the forecast's 2 layers
    for elapsed, probability, rate in seen[18:]:
        # The next layer is within the last forecast's two layers for one layer after a call;
        # beyond them eviction has the rate.
        assert probability == pytest.approx(0.9 if elapsed < 2 else rate)


def _first_reply_predictor(expert: int, horizon: int = LAYERS):
    """A predictor whose every horizon names ``expert``."""

    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        probs = torch.full((horizon, EXPERTS), 0.01)
        probs[:, expert] = 0.9
        return probs

    return predict


def test_the_prompts_last_token_forecasts_the_replys_first_layers_up_to_this_one() -> None:
    policy = SeqMoEPolicy(_first_reply_predictor(2), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    for layer in range(3):
        policy.observe(layer, list(range(EXPERTS)))
    policy.look_past_prompt(2, torch.zeros(4), torch.tensor([2]))
    # From layer 2, horizons 2, 3 and 4 reach the reply's first token: its layers 0, 1 and 2.
    for layer in range(3):
        assert policy.probability((layer, 2)) == pytest.approx(0.9)
        assert policy.probability((layer, 0)) < 0.01
    # Layer 3 is still the prompt's: what prefill streams there says nothing of the reply.
    assert policy.probability((3, 2)) == policy.probability((3, 0)) == policy.recent_rates()[3, 0]
    assert policy.calls == 0, "prefill forecasts are not part of the decode cost"


def test_a_forecast_that_does_not_reach_past_the_prompt_changes_nothing() -> None:
    policy = SeqMoEPolicy(_first_reply_predictor(2, horizon=1), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
    policy.observe(0, list(range(EXPERTS)))
    policy.look_past_prompt(1, torch.zeros(4), torch.tensor([2]))
    assert all(policy.probability((0, e)) == policy.recent_rates()[0, e] for e in range(EXPERTS))


def test_prefill_keeps_the_experts_the_reply_starts_with() -> None:
    kept = {}
    for told in (False, True):
        policy = SeqMoEPolicy(_first_reply_predictor(2), LAYERS, torch.full((LAYERS, EXPERTS), 0.3))
        clock = VirtualClock()  # each layer computes long enough for its streamed copies to land
        cache = virtual_cache(10, policy, clock, seconds_per_copy=0.1)
        for layer in range(LAYERS):  # a prefill pass routed to three experts of each layer
            slots = cache.acquire(layer, [0, 1, 2], prefill=True)
            if told:
                policy.look_past_prompt(layer, torch.zeros(4), torch.tensor([2]))
            if layer + 1 < LAYERS:
                cache.stream(layer + 1, policy.stream_order(layer + 1))
            clock.now += 1.0
            cache.release(slots)
        kept[told] = {key for key in cache.pool.slot_of if key[0] < LAYERS - 1}
    # Streaming the last layer left room for three of the earlier layers' experts besides layer
    # 2's: told, they include the reply's first two; not told, the prompt's most recent.
    assert {(0, 2), (1, 2)} <= kept[True]
    assert (1, 2) not in kept[False]


def oracle_cache(future: list[tuple[int, frozenset[int]]], size: int, clock: VirtualClock) -> ExpertCache:
    return virtual_cache(size, OraclePolicy(future, LAYERS, EXPERTS), clock, seconds_per_copy=1.0)


def test_a_layer_never_evicts_one_of_its_own_experts_to_load_another() -> None:
    future = [(1, frozenset({0})), (0, frozenset({1})), (0, frozenset({0, 1})), (1, frozenset({0}))]
    clock = VirtualClock()
    cache = oracle_cache(future, 2, clock)
    routed = []
    cache.events.subscribe(lambda e: routed.append(e.missed) if isinstance(e, LayerRouted) else None)
    for layer, experts in future:
        slots = cache.acquire(layer, sorted(experts), prefill=False)
        assert [cache.pool.owner[s] for s in slots] == [(layer, e) for e in sorted(experts)]
        cache.release(slots)
    # (0, 1) is never used after the third step, so the oracle would name it first; but that
    # step needs it, so its miss of (0, 0) must take (1, 0)'s slot.
    assert routed == [(0,), (1,), (0,), (0,)]


def test_prefill_chooses_a_streamed_experts_victim_again_once_the_layer_before_is_done() -> None:
    future = [(0, frozenset({3})), (0, frozenset({0, 1})), (1, frozenset({0, 1})), (0, frozenset({3})), (1, frozenset({0}))]
    clock = VirtualClock()
    cache = oracle_cache(future, 4, clock)
    cache.release(cache.acquire(0, [3], prefill=False))
    slots = cache.acquire(0, [0, 1], prefill=True)
    # While layer 0 computes, only (0, 3) can make room for layer 1's second expert, and its copy
    # waits behind the first one's.
    cache.stream(1, cache.policy.stream_order(1))
    clock.now += 0.5
    cache.release(slots)
    cache.release(cache.acquire(1, [0, 1], prefill=True))
    # Layer 0 is done and none of its prompt experts comes back: one of them makes room instead.
    cache.release(cache.acquire(0, [3], prefill=False))
    assert cache.phases["decode"].misses == 1


def queued_prefetch_cache(link: Callable[[VirtualClock, float, int], SimulatedCopier] = SimulatedCopier) -> tuple[ExpertCache, VirtualClock, list[object]]:
    """A full cache of three layer-0 experts, then two prefetches of layer 1 on a link busy
    with the first: the first copy has started, the second is queued."""
    clock = VirtualClock()
    policy = belady()
    cache = virtual_cache(3, policy, clock, seconds_per_copy=4.0, link=link)
    for expert in (0, 1, 2):
        cache.release(cache.acquire(0, [expert], prefill=False))
        clock.now += 8.0  # the layer computes: the link is busy half the time
    events: list[object] = []
    cache.events.subscribe(events.append)
    forecasts = [Forecast((1, 0), 0.9, 1), Forecast((1, 1), 0.8, 1)]
    policy.remember(forecasts, {1})
    cache.plan(forecasts)
    assert [cache.pool.owner.count(key) for key in ((1, 0), (1, 1))] == [1, 1]
    return cache, clock, events


def weights_of(cache: ExpertCache, key: tuple[int, int]) -> float:
    return cache.pool.tensors["gate_up_proj"][cache.pool.slot_of[key]][0, 0].item()


def test_a_cancelled_prefetch_gives_the_slot_back_to_the_expert_it_displaced() -> None:
    cache, _clock, events = queued_prefetch_cache()
    resident = {key for key in cache.pool.slot_of if key[0] == 0}
    assert len(resident) == 1  # two of layer 0's experts made room
    cache.plan([])  # the re-plan cancels the queued prefetch; its copy never started
    back = {key for key in cache.pool.slot_of if key[0] == 0} - resident
    assert len(back) == 1 and (1, 1) not in cache.pool.slot_of
    (key,) = back
    copied = cache.copier.bytes_copied
    slots = cache.acquire(*key[:1], [key[1]], prefill=False)
    assert cache.copier.bytes_copied == copied and cache.phases["decode"].misses == 3  # a hit: no copy
    assert weights_of(cache, key) == key[1]
    cache.release(slots)
    assert evicted_keys(events) == {(0, 0), (0, 1), (0, 2)} - resident - back


def evicted_keys(events: list[object]) -> set[tuple[int, int]]:
    return {e.key for e in events if isinstance(e, ExpertEvicted)}


def test_a_layer_gets_back_an_expert_whose_displacing_prefetch_has_not_started() -> None:
    cache, _clock, events = queued_prefetch_cache()
    (victim,) = {(0, 0), (0, 1), (0, 2)} - set(cache.pool.slot_of) - evicted_keys(events)
    copied = cache.copier.bytes_copied
    slots = cache.acquire(0, [victim[1]], prefill=False)
    assert cache.copier.bytes_copied == copied and cache.phases["decode"].misses == 3
    assert weights_of(cache, victim) == victim[1] and (1, 1) not in cache.pool.slot_of
    assert cache.prefetches.cancelled == 1
    cache.release(slots)


class LinkAheadCopier(SimulatedCopier):
    """A link that has moved on by the time it is asked: a queued copy starts and lands between
    the cache's look at its state and its question whether it is done, as the emulated link's
    thread or a CUDA stream may do."""

    def done(self, job: CopyJob) -> bool:
        if job.state is JobState.QUEUED and take_queued(self._queue, job) is not None:
            self._start(job, self.clock.now)
            self.clock.now = self._running[job]
        return super().done(job)


def test_a_queued_prefetch_that_lands_between_two_looks_still_evicts_its_victim() -> None:
    cache, _clock, events = queued_prefetch_cache(LinkAheadCopier)
    (victim,) = {(0, 0), (0, 1), (0, 2)} - set(cache.pool.slot_of) - evicted_keys(events)
    slots = cache.acquire(0, [victim[1]], prefill=False)  # the queued copy over it lands meanwhile
    assert victim in evicted_keys(events) and (1, 1) in cache.pool.slot_of
    assert weights_of(cache, victim) == victim[1] and cache.phases["decode"].misses == 4
    cache.release(slots)


def test_a_displaced_expert_is_evicted_when_the_copy_over_it_starts() -> None:
    cache, clock, events = queued_prefetch_cache()
    assert sum(isinstance(e, ExpertEvicted) for e in events) == 1  # the started copy's victim only
    clock.now += 4.0  # the first copy lands and the second starts
    cache.release(cache.acquire(1, [0], prefill=False))
    assert sum(isinstance(e, ExpertEvicted) for e in events) == 2
    cache.plan([])  # too late to cancel: the copy is on its way
    assert (1, 1) in cache.pool.slot_of


def test_an_expert_whose_prefetch_has_not_landed_is_late_not_a_hit() -> None:
    """Its layer waits for it as for a miss (a copy not started even starts only then)."""
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=4.0)
    cache.release(cache.acquire(1, [0], prefill=False))  # a miss
    clock.now += 8.0
    cache.plan([Forecast((2, 0), 0.9, 1), Forecast((2, 1), 0.9, 1)])  # the second waits behind the first
    clock.now += 1.0
    cache.release(cache.acquire(2, [0, 1], prefill=False))  # one on the link, one not started
    counters = cache.phases["decode"]
    assert (counters.hits, counters.late, counters.misses) == (0, 2, 1)
    clock.now += 10.0
    cache.release(cache.acquire(2, [0, 1], prefill=False))  # both landed long ago
    assert (counters.hits, counters.late, counters.misses) == (2, 2, 1)


def test_a_prefetch_no_layer_of_its_generation_used_counts_as_unused_once() -> None:
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=1.0)
    heard: list[object] = []
    cache.events.subscribe(heard.append)
    cache.plan([Forecast((2, 0), 0.9, 1), Forecast((2, 1), 0.9, 1)])
    clock.now += 3.0
    cache.release(cache.acquire(2, [0], prefill=False))  # the first is used, the second not
    cache.end_of_generation()
    assert cache.prefetches.unused == 1 and [e.key for e in heard if isinstance(e, PrefetchUnused)] == [(2, 1)]
    cache.release(cache.acquire(2, [1], prefill=True))  # the next generation finds it: a hit, nothing more
    cache.end_of_generation()
    assert cache.prefetches.unused == 1 and cache.phases["prefill"].hits == 1


def test_a_cancelled_prefetch_is_not_counted_as_copied() -> None:
    clock = VirtualClock()
    cache = virtual_cache(4, belady(), clock, seconds_per_copy=4.0)
    expert = cache.host.layout.bytes_per_expert
    cache.release(cache.acquire(0, [0, 1], prefill=True))  # two prefill misses
    clock.now += 8.0
    cache.release(cache.acquire(1, [0], prefill=False))  # a decode miss
    cache.plan([Forecast((2, 0), 0.9, 1), Forecast((2, 1), 0.9, 1)])  # the second waits behind the first
    assert (cache.phases["prefill"].copied_bytes, cache.phases["decode"].copied_bytes) == (2 * expert, 3 * expert)
    cache.plan([])
    assert (cache.phases["prefill"].copied_bytes, cache.phases["decode"].copied_bytes) == (2 * expert, 2 * expert)
    assert cache.copier.bytes_copied == 4 * expert


def test_forecasts_that_keep_coming_true_are_raised_for_prefetching_and_eviction() -> None:
    # As the router fallback does: a softmax share (0.15 for expert 2, 0.05 for the rest) where
    # the layer chooses its top 2, expert 2 every time.
    def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        probs = torch.full((1, EXPERTS), 0.05)
        probs[0, 2] = 0.15
        return probs

    policy = SeqMoEPolicy(predict, LAYERS, torch.full((LAYERS, EXPERTS), 0.5), stride=1)
    first = None
    for step in range(400 * LAYERS):
        layer = step % LAYERS
        policy.observe(layer, [2, step % 2])
        made = {f.key: f.probability for f in policy.forecast(layer, torch.zeros(4), torch.tensor([2, step % 2]))}
        first = first or made
    nearest = ((layer + 1) % LAYERS, 2)
    assert first[(1, 2)] == pytest.approx(0.15) and made[nearest] > 0.9 and policy.probability(nearest) > 0.9
    # Of the three forecast at 0.05, each layer chose one every time (expert 0 or 1): a third.
    assert made[((layer + 1) % LAYERS, 3)] == pytest.approx(1 / 3, abs=0.05)


def test_a_cache_starts_with_the_experts_its_policy_expects_first_and_none_under_lru() -> None:
    prior = torch.full((LAYERS, EXPERTS), 0.1)
    prior[2, 3], prior[0, 1], prior[3, 0] = 0.9, 0.8, 0.7
    clock = VirtualClock()
    cache = virtual_cache(2, BeladyPolicy(LAYERS, prior), clock, seconds_per_copy=1.0)
    cache.warm()
    # The two likeliest, copied over the link (the clock moved) and ready; no layer waited for them.
    assert dict(cache.pool.slot_of) == {(2, 3): 0, (0, 1): 1} and clock.now == pytest.approx(2.0)
    assert all(cache.pool.state(slot) is SlotState.READY for slot in range(2)) and not cache.copier.take_stalls()
    assert cache.acquire(2, [3], prefill=True) == [0] and cache.phases["prefill"].hits == 1
    assert BeladyPolicy(LAYERS, torch.full((LAYERS, EXPERTS), 0.1)).warm_order(2) == []  # a flat prior says nothing
    assert Policy(LAYERS, EXPERTS).warm_order(2) == []  # lru and gate start empty, as the peers do


def test_the_oracle_starts_with_the_experts_the_run_uses_first() -> None:
    future = [(1, frozenset({2, 0})), (2, frozenset({1})), (1, frozenset({0, 3})), (3, frozenset({3}))]
    assert OraclePolicy(future, LAYERS, EXPERTS).warm_order(4) == [(1, 0), (1, 2), (2, 1), (1, 3)]
    assert OraclePolicy(future, LAYERS, EXPERTS, lookahead=2).warm_order(4) == [(1, 0), (1, 2), (2, 1)]


def test_seqmoe_without_a_predictor_loads_the_routers_top_k_as_gate_does_and_evicts_by_belady() -> None:
    routers = [torch.nn.Linear(2, EXPERTS, bias=False) for _ in range(LAYERS)]
    with torch.no_grad():
        for router in routers:  # on the hidden state (1, 0): experts 0 and 1 first, at 0.70 and 0.26
            router.weight.copy_(torch.tensor([[3.0, 0.0], [2.0, 0.0], [0.0, 0.0], [-1.0, 0.0]]))
    policy = RouterSeqMoEPolicy(routers, EXPERTS, top_k=2)
    cache = make_cache(4, policy)
    for _ in range(8):  # (2, 1) is used at every token, (3, 2) once, after it
        cache.release(cache.acquire(2, [1], prefill=False))
    cache.release(cache.acquire(3, [2], prefill=False))
    slots = cache.acquire(0, [3], prefill=False)
    with torch.no_grad():  # as the engine generates
        forecasts = policy.forecast(0, torch.tensor([1.0, 0.0]), torch.tensor([3]))
    assert sorted(f.key for f in forecasts) == [(1, 0), (1, 1)]
    cache.link_load = 9.0  # the schedule would admit nothing below 0.9 here
    cache.plan(forecasts)
    cache.release(slots)
    # Both guesses load, as gate's do; the one slot they need beyond the free one is taken from
    # (3, 2), seldom used, not from (2, 1), the least recently used.
    assert {(1, 0), (1, 1), (2, 1)} <= set(cache.pool.slot_of) and cache.prefetches.issued == 2
    cache.copier.close()


def test_seqmoe_without_a_predictor_loads_the_routers_top_k_among_many_experts() -> None:
    # A router spread over 128 experts gives each less than the predictor's floor of 0.02: about one
    # of the top 8 was loaded.
    torch.manual_seed(0)
    routers = [torch.nn.Linear(16, 128, bias=False) for _ in range(LAYERS)]
    policy = RouterSeqMoEPolicy(routers, 128, top_k=8)
    hidden = torch.randn(16) * 0.1
    with torch.no_grad():
        made = policy.forecast(0, hidden, torch.tensor([0]))
        best = torch.softmax(routers[1](hidden), dim=0).topk(8).indices.tolist()
    assert sorted(f.key for f in made) == sorted((1, expert) for expert in best)
