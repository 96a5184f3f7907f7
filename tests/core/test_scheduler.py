"""Greedy JSD against exhaustive search on small instances."""

from __future__ import annotations

import itertools
import random

import pytest

from seqmoe.scheduler import Job, schedule


def feasible(jobs: tuple[Job, ...], capacity: int) -> bool:
    """Unit jobs fit if, sorted by deadline, the i-th (1-based) has a deadline of at least i."""
    if len(jobs) > capacity:
        return False
    return all(job.deadline >= i for i, job in enumerate(sorted(jobs, key=lambda j: j.deadline), 1))


def best_profit(jobs: list[Job], capacity: int) -> float:
    return max(
        sum(j.profit for j in subset)
        for size in range(len(jobs) + 1)
        for subset in itertools.combinations(jobs, size)
        if feasible(subset, capacity)
    )


@pytest.mark.parametrize("seed", range(300))
def test_greedy_plan_is_as_profitable_as_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [Job((rng.randrange(4), i), rng.randrange(-1, 6), round(rng.random(), 3)) for i in range(rng.randrange(1, 8))]
    capacity = rng.randrange(0, 7)
    plan = schedule(jobs, capacity)
    assert sum(j.profit for j in plan) == pytest.approx(best_profit(jobs, capacity))
    assert len(plan) <= capacity
    # Run back to back in plan order, each copy ends before its deadline.
    assert all(job.deadline >= position for position, job in enumerate(plan, 1))


def test_latest_free_slot_leaves_early_slots_for_urgent_jobs() -> None:
    relaxed = Job((1, 0), deadline=3, profit=0.9)
    urgent = Job((0, 0), deadline=1, profit=0.5)
    assert schedule([relaxed, urgent], capacity=5) == [urgent, relaxed]


def test_likely_late_jobs_are_kept_and_run_first() -> None:
    on_time = Job((1, 0), deadline=2, profit=0.3, probability=0.3)
    likely_late = [Job((0, 1), deadline=0, profit=0.9, probability=0.9), Job((0, 2), deadline=-1, profit=0.6, probability=0.6)]
    unlikely_late = Job((0, 3), deadline=0, profit=0.2, probability=0.2)
    plan = schedule([on_time, *likely_late, unlikely_late], capacity=5, keep_late_above=0.5)
    assert plan == [likely_late[1], likely_late[0], on_time]


def test_short_room_goes_to_the_most_profitable_late_or_on_time_jobs() -> None:
    far = Job((3, 0), deadline=4, profit=0.55, probability=0.55)
    near_late = Job((1, 0), deadline=0, profit=0.8, probability=0.8)
    on_time = Job((2, 0), deadline=2, profit=0.7, probability=0.7)
    # A far on-time job can wait for a later re-plan; the likely late one cannot.
    assert schedule([far, near_late, on_time], capacity=2, keep_late_above=0.5) == [near_late, on_time]
    assert schedule([far, near_late, on_time], capacity=1, keep_late_above=0.5) == [near_late]


@pytest.mark.parametrize("seed", range(100))
def test_a_plan_runs_in_deadline_order(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [Job((0, i), rng.randrange(-2, 8), round(rng.random(), 3), rng.random()) for i in range(rng.randrange(1, 10))]
    plan = schedule(jobs, rng.randrange(1, 10), keep_late_above=0.5)
    assert [job.deadline for job in plan] == sorted(job.deadline for job in plan)


def test_jobs_that_share_a_deadline_run_in_the_order_their_layers_come() -> None:
    """A deadline counts whole copies, so several layers share one; within it the layer needed
    first goes first, whatever its probability, also when the next token's first layers follow
    the last ones of this token."""
    last_layer = Job((7, 2), deadline=3, profit=0.5, probability=0.5, horizon=2)
    next_token = Job((0, 3), deadline=3, profit=0.9, probability=0.9, horizon=3)
    sooner = Job((6, 1), deadline=3, profit=0.4, probability=0.4, horizon=1)
    assert schedule([next_token, last_layer, sooner], capacity=3) == [sooner, last_layer, next_token]


def test_jobs_past_their_deadline_are_dropped() -> None:
    late, later = Job((0, 1), deadline=0, profit=1.0), Job((0, 5), deadline=-2, profit=2.0)
    crowded = [Job((0, i), deadline=1, profit=0.1 * i) for i in range(2, 5)]
    plan = schedule([late, later, *crowded], capacity=5)
    assert plan == [crowded[-1]]
