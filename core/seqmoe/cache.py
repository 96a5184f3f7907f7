"""The expert cache: the slot pool, run by a policy, filled through a copy backend.

``acquire`` is the only way compute gets at an expert: it pins the slots a layer needs,
loads the misses ahead of every queued prefetch, runs the caller's look-ahead while they
are on their way, and makes compute wait until each slot is ready. ``release`` unpins them
when the layer is done. A pinned slot, or one whose copy is still on its way (needed by a
layer in flight), is never chosen as a victim, so a layer never computes with weights that
are being overwritten.

``plan`` turns a policy's forecast into prefetches (JSD, see ``scheduler``) after every
decode layer; ``stream`` loads the next layer's experts during prefill; ``warm`` fills the
free slots while no prompt runs.

A queued prefetch takes its victim's slot, but the victim's weights stay there untouched
until the copy starts: every layer re-plans and cancels the queued prefetches, and a
cancelled one gives the slot back to its victim, so re-planning never costs a reload. A
layer that asks for a victim whose prefetch is still queued gets it back the same way, as
a hit. Only when the copy starts is the victim evicted (counted and reported).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .events import (
    CacheSnapshot,
    EventBus,
    ExpertEvicted,
    LayerRouted,
    PrefetchCancelled,
    PrefetchCompleted,
    PrefetchIssued,
    PrefetchUnused,
    SlotStatus,
    Stall,
)
from .policies import Forecast, Forecasts, Policy, flat_indices
from .scheduler import Job, schedule
from .store import HostStore, SlotPool, SlotState
from .transfer import Copier, CopyJob, ExpertKey, JobState, MeasuredStall

PHASES = ("prefill", "decode")
LAYER_TIME_SMOOTHING = 0.2
KEEP_LATE_ABOVE = 0.5
"""Late prefetches at least this likely are still queued (see ``scheduler``)."""
SNAPSHOT_SECONDS = 0.05
"""At most one cache-map snapshot per this interval: a panel redraws at a few hertz, and a
snapshot costs one pass over the slots."""


@dataclass
class PhaseCounters:
    hits: int = 0
    """Experts a layer found ready in their slots."""
    late: int = 0
    """Experts a layer found on their way (a prefetch whose copy had not landed): it waited for
    them as for a miss, though without asking for another copy."""
    misses: int = 0
    """Experts a layer found in no slot: each is copied for it."""
    copied_bytes: int = 0
    """Bytes of the copies the phase asked for and did not cancel (misses and prefetches)."""


@dataclass
class PrefetchCounters:
    issued: int = 0
    used: int = 0
    unused: int = 0
    """Copied, and no layer of the generation that asked for them used them (evicted first, or
    still there when it ended)."""
    cancelled: int = 0
    """Dropped from the queue by a re-plan before their copy started (no bytes moved)."""

    @property
    def copied(self) -> int:
        return self.issued - self.cancelled


class ExpertCache:
    def __init__(
        self,
        host: HostStore,
        size: int,
        device: torch.device,
        copier: Copier,
        policy: Policy,
        events: EventBus,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.host = host
        self.clock = clock
        self.pool = SlotPool(host.layout, size, device)
        self.copier = copier
        self.policy = policy
        self.events = events
        self.phases = {phase: PhaseCounters() for phase in PHASES}
        self.prefetches = PrefetchCounters()
        self._queued: dict[ExpertKey, CopyJob] = {}
        """Copies on their way into slots no layer has pinned: the prefetches, and the misses of a
        layer that failed before they landed (``_abandon``)."""
        self._prefetched: set[ExpertKey] = set()
        self._displaced: dict[ExpertKey, ExpertKey] = {}
        """Queued prefetch -> the expert whose slot it took, still intact there (see above)."""
        self._displaced_by: dict[ExpertKey, ExpertKey] = {}
        self.layer_seconds: float | None = None
        self._last_decode_layer_at: float | None = None
        self._last_snapshot_at = float("-inf")
        self.link_load = 0.0
        """Smoothed copy time decode asks for per second of decode compute (above 1: more than
        the link can carry while the layers compute)."""
        self.stall_seconds = 0.0
        """Smoothed time a decode layer waits for copies."""
        self.plan_seconds: float | None = None
        """Smoothed host time of one ``plan``, the copies it queues included."""
        self._copies_this_layer = 0
        self._stalled_this_layer = 0.0
        self._overlapped = 0.0
        """The host work of the last layer's ``meanwhile``, until a stall of that layer is read."""

    @property
    def size(self) -> int:
        return self.pool.size

    @property
    def hits(self) -> int:
        return sum(c.hits for c in self.phases.values())

    @property
    def misses(self) -> int:
        return sum(c.misses for c in self.phases.values())

    def acquire(
        self, layer: int, experts: Sequence[int], prefill: bool, meanwhile: Callable[[], object] | None = None
    ) -> list[int]:
        """Pin a ready slot for each of ``experts`` (distinct) of MoE layer ``layer``. ``meanwhile`` runs once
        the copies of the missing experts are on their way, before the layer waits for them: host
        work done there (the look-ahead) overlaps the wait instead of adding to it."""
        if len(set(experts)) != len(experts):  # two slots would hold the expert, and the books lose one
            raise ValueError(f"layer {layer} names an expert twice: {list(experts)}")
        phase = "prefill" if prefill else "decode"
        # On CUDA a layer's stall can be read only once the GPU has passed it, which the host
        # knows after the next layer's routing: read here, it is charged to the layer that
        # waited, whose time ``_time_layer`` closes now. Read after the wait below instead, it
        # was charged to the next layer, whose compute then came out near zero and its link
        # load huge, which stopped prefetching.
        stalls = [] if self.copier.blocks_host else self._take_stalls()
        if not prefill:
            self._time_layer()
        self._settle_queued()
        if prefill:
            # The copies streamed for this layer that have not started chose their victims while
            # the layer before was pinned; now it is done and its experts, often not needed again
            # soon, can make room instead: those copies are loaded again as misses below, and
            # their victims return. Simulated on the held-out chat (cache ratio 0.45), this cut the
            # oracle's decode copies from 3.35 to 2.90 per token and seqmoe's from 5.35 to 5.17,
            # and prefill got faster, not slower.
            self._cancel_queued()
        self.policy.observe(layer, experts)
        pinned: list[int] = []
        try:
            # The experts already there are pinned before any miss chooses a victim: a layer never
            # evicts one of its own experts to load another.
            found = []
            for expert in experts:
                found.append(self._pin_resident((layer, expert)))
                if found[-1] is not None:
                    pinned.append(found[-1])
            missed = [expert for expert, slot in zip(experts, found) if slot is None]
            # Found on their way: the cache has just settled the copies that landed (``_settle_queued``).
            late = [e for e, slot in zip(experts, found) if slot is not None and self.pool.state(slot) is SlotState.LOADING]
            slots = []
            for expert, slot in zip(experts, found):
                if slot is None:
                    slot = self._load((layer, expert), phase, urgent=True)
                    self.pool.pins[slot] += 1
                    pinned.append(slot)
                slots.append(slot)
            counters = self.phases[phase]
            counters.hits += len(experts) - len(missed) - len(late)
            counters.late += len(late)
            counters.misses += len(missed)
            if self.events.active:  # before ``meanwhile``: a listener hears of a routing before the forecasts made from it
                self.events.emit(LayerRouted(layer, tuple(experts), tuple(missed), prefill, tuple(late)))
            began = self.clock()
            if meanwhile is not None:
                meanwhile()
            overlapped = self.clock() - began
            for slot in slots:
                job = self.pool.job[slot]
                if job is not None and job.state is not JobState.DONE:  # a slot whose copy landed needs no wait
                    self.copier.wait(job, phase)
        except BaseException:
            self._abandon(pinned, phase)
            raise
        self._overlapped = overlapped
        if self.copier.blocks_host:  # the emulated link measures a stall as the layer waits
            stalls = self._take_stalls()
        if self.events.active:
            self._report(layer, stalls)
        return slots

    def _take_stalls(self) -> list[MeasuredStall]:
        """The stalls measured since the last look, charged to the decode layer being timed."""
        stalls = self.copier.take_stalls()
        stalled = sum(stall.seconds for stall in stalls if stall.phase == "decode")
        if stalled > 0:
            # A layer that still waited after ``meanwhile`` waited for the link all along: the host
            # work only filled the wait, and the link, not the host, set the layer's time.
            self._stalled_this_layer += stalled + self._overlapped
            self._overlapped = 0.0
        return stalls

    def _pin_resident(self, key: ExpertKey) -> int | None:
        """Pin the slot that holds (or is receiving) ``key``; ``None`` if it is not there."""
        slot = self.pool.slot_of.get(key)
        if slot is None and key in self._displaced_by:
            slot = self._reclaim(key)
        if slot is None:
            return None
        if key in self._prefetched:
            self._prefetched.discard(key)
            self.prefetches.used += 1
        if self._queued.pop(key, None) is not None:
            self._displacement_done(key)
        self.pool.pins[slot] += 1
        return slot

    def _report(self, layer: int, stalls: list[MeasuredStall]) -> None:
        emit = self.events.emit
        for stall in stalls:
            emit(Stall(stall.key, stall.seconds, "miss" if stall.urgent else "late prefetch", stall.phase == "prefill"))
        now = self.clock()
        if now - self._last_snapshot_at >= SNAPSHOT_SECONDS:
            self._last_snapshot_at = now
            emit(self.snapshot(layer))

    def snapshot(self, layer: int) -> CacheSnapshot:
        """What every slot holds now; pinned slots are in use by layer ``layer``."""
        pool = self.pool
        states = []
        for slot in range(pool.size):
            if pool.pins[slot]:
                states.append(SlotStatus.IN_USE)
            else:
                states.append(_SLOT_STATUS[pool.state(slot)])
        return CacheSnapshot(layer, tuple(pool.owner), tuple(states))

    def _settle_queued(self) -> None:
        """Forget prefetches that have arrived (reporting them), so only copies on their way count as queued."""
        for key, job in list(self._queued.items()):
            # Asked before the state is read: the link may start and finish a copy between two
            # looks, and a copy that is done has displaced its victim.
            arrived = self.copier.done(job)
            if arrived or job.state is not JobState.QUEUED:
                self._displacement_done(key)
            if arrived:
                del self._queued[key]
                if self.events.active and not job.urgent:  # not a miss whose layer gave up on it
                    self.events.emit(PrefetchCompleted(key))

    def release(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self.pool.pins[slot] -= 1
            self.copier.release(slot)

    def _abandon(self, slots: Sequence[int], phase: str) -> None:
        """Unpin the slots of an ``acquire`` that failed (in its look-ahead, its copies, or for
        want of unpinned slots): left pinned, they could never be evicted again. Each copy into
        them lands first: a miss's slot is no queued prefetch, so unpinned while its copy is on
        its way it could become a victim, and that copy would overwrite the next one's."""
        try:
            for slot in slots:
                job = self.pool.job[slot]
                if job is not None:
                    self.copier.wait(job, phase)
        finally:
            self._keep_unlanded([job for slot in slots if (job := self.pool.job[slot]) is not None])
            self.release(slots)

    def _keep_unlanded(self, jobs: Sequence[CopyJob]) -> None:
        """Keep each of ``jobs`` that has not landed (its write failed, or the wait for another did)
        on the books of copies on their way: its slot is no victim until it lands, so a later copy
        into that slot is never overwritten by it."""
        for job in jobs:
            if self.pool.state(job.slot) is SlotState.LOADING:
                self._queued[job.key] = job

    def resize(self, size: int) -> None:
        """Grow or shrink the pool between two generations, keeping the most recently used experts.

        The old pool is freed before the new one is allocated, so the two never hold device
        memory together; the kept experts are copied back from host memory. When the device
        has no memory for the new size, the pool is rebuilt at its old size, in the memory the
        old one held, and the ``OutOfMemoryError`` is raised.
        """
        self._cancel_queued()
        while any(not self.copier.done(job) for job in self._queued.values()):
            time.sleep(0.001)
        if self.pool.device.type == "cuda":
            torch.cuda.synchronize(self.pool.device)
        resident = sorted(self.pool.slot_of, key=self.policy.recency, reverse=True)
        layout, device, previous = self.pool.layout, self.pool.device, self.pool.size
        for key in list(self._displaced):
            self._displacement_done(key)
        self._queued.clear()
        self._prefetched.clear()
        del self.pool
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            self.pool = SlotPool(layout, size, device)
        except torch.OutOfMemoryError:
            self.pool = SlotPool(layout, previous, device)
            self._fill(resident)
            raise
        self._fill(resident)

    def warm(self) -> None:
        """While no prompt runs: copy the experts the policy expects first (``Policy.warm_order``)
        that are not resident into the free slots, over the link, and wait for them. An empty
        cache copies nearly every expert the first prompt routes to; filled with those likeliest
        to be used, the first prefill finds many of them there. These waits are no layer's stalls."""
        jobs = []
        for key in self.policy.warm_order(self.size):
            slot = self.pool.free_slot()
            if slot is None:
                break
            if key not in self.pool.slot_of:
                self._load(key, "prefill", urgent=False, slot=slot)
                jobs.append(self.pool.job[slot])
        try:
            for job in jobs:
                self.copier.wait(job, "prefill")
        finally:
            self._keep_unlanded(jobs)
        # Read now and dropped (on CUDA, reading them waits for the copies to land): no layer waited.
        self.copier.stall_seconds()
        self.copier.take_stalls()

    def _fill(self, resident: Sequence[ExpertKey]) -> None:
        """Copy the first of ``resident`` that fit into the new, empty pool."""
        for slot, key in enumerate(resident[: self.pool.size]):
            self.host.expert(key).write_into(self.pool.destinations(slot))
            self.pool.assign(slot, key, None)

    def plan(self, forecasts: Sequence[Forecast]) -> None:
        """Replace the queued prefetches by the JSD schedule of ``forecasts`` (a speculative
        policy's forecasts are all queued, in their order)."""
        start = self.clock()
        self._plan(forecasts)
        seconds, known = self.clock() - start, self.plan_seconds
        self.plan_seconds = seconds if known is None else known + LAYER_TIME_SMOOTHING * (seconds - known)

    def _plan(self, forecasts: Sequence[Forecast]) -> None:
        self._cancel_queued()
        if self.policy.speculative:
            # Without an admission rule, the victims must at least not be the forecast experts
            # already here (least recently used, the next layer's are often the oldest).
            victims = self._victims(excluded=flat_indices([f.key for f in forecasts], self.host.layout.num_experts))
            for forecast in forecasts:
                if forecast.key not in self.pool.slot_of and not self._prefetch(forecast.key, victims, "decode", admit_all=True):
                    break
            return
        made = Forecasts.of(forecasts)
        held = self.pool.held
        resident = np.zeros(self.host.total_experts, dtype=bool)
        resident[held[held >= 0]] = True
        wanted = (made.probability >= self.worth_prefetching()) & ~resident[made.flat(self.host.layout.num_experts)]
        best: dict[ExpertKey, Forecast] = {}
        for forecast in made.where(wanted):
            known = best.get(forecast.key)
            if known is None or forecast.probability > known.probability:
                best[forecast.key] = forecast
        if not best:
            return
        copy_seconds = self.copier.seconds_per_copy(self.host.bytes_per_copy)
        in_flight = len(self._queued)

        def deadline(horizon: int) -> int:
            if self.layer_seconds is None:  # no decode layer timed yet: only the room limits the plan
                return len(best)
            return int(horizon * self.layer_seconds / copy_seconds) - in_flight

        jobs = [Job(key, deadline(f.horizon), f.probability * copy_seconds, f.probability, f.horizon) for key, f in best.items()]
        candidates = self._candidates()
        room = len(self.pool.free) + len(candidates)
        victims = EvictionQueue(self.policy.eviction_order(candidates))
        for job in schedule(jobs, room, keep_late_above=KEEP_LATE_ABOVE):
            if not self._prefetch(job.key, victims, "decode", job.probability):
                break

    def worth_prefetching(self, victim_reuse: float = 0.0) -> float:
        """The lowest probability a prefetch must have to pay for its link time, when the slot it
        takes holds an expert needed again within a token with probability ``victim_reuse``.

        With the link's load ``rho`` (copy time asked per second of compute), a copy delays
        compute by ``min(1, rho)`` of its time, and a miss turned into a timely prefetch saves
        ``min(1, 1 / rho)`` of a copy's stall (on a saturated link the copy happens either way,
        only its overlap with compute is won). A prefetch that goes unused (probability
        ``1 - p``) wasted its copy and, with probability ``victim_reuse``, the victim's reload;
        one that is used evicted no more than its miss would have. It pays when
        ``p * min(1, 1/rho) > (1 - p) * (1 + victim_reuse) * min(1, rho)``, in both cases

            p > x / (1 + x),     x = (1 + victim_reuse) * rho:

        any forecast on an idle link, only near-certain ones on a link asked for many times
        what it carries.
        """
        # A cancel counts against the layer whose re-plan drops it, not the one that asked for the
        # copy, so after a large cancel the smoothed load can dip below zero: no demand, not less.
        cost = (1.0 + victim_reuse) * max(self.link_load, 0.0)
        return cost / (1.0 + cost)

    def stream(self, layer: int, order: Sequence[int]) -> None:
        """Prefill: queue layer ``layer``'s experts in ``order`` while the layer before computes,
        without evicting any of them or anything pinned."""
        experts = self.host.layout.num_experts
        victims = self._victims(excluded=np.arange(layer * experts, (layer + 1) * experts))
        for expert in order:
            key = (layer, expert)
            if key not in self.pool.slot_of and not self._prefetch(key, victims, "prefill", admit_all=True):
                return

    def _prefetch(
        self, key: ExpertKey, victims: EvictionQueue, phase: str, probability: float = 1.0, admit_all: bool = False
    ) -> bool:
        """Queue a prefetch of ``key`` (used with ``probability``) for ``phase`` into a free slot or in
        place of the next of ``victims``; False when there is no slot it deserves."""
        if key in self._displaced_by:  # its weights are still in a slot; a re-plan or its layer reclaims them
            return True
        slot = self.pool.free_slot()
        if slot is None:
            victim = victims.peek()
            if victim is None:
                return False
            wanted, held = self.policy.distance(key), self.policy.distance(victim)
            if not admit_all and wanted is not None and held is not None:
                reuse = min(1.0, self.host.num_layers / held)
                if wanted >= held or probability <= self.worth_prefetching(reuse):
                    return False
            victims.take()
            slot = self.pool.slot_of[victim]
            self.pool.clear(slot)
            self._displaced[key], self._displaced_by[victim] = victim, key
        self._load(key, phase, urgent=False, slot=slot)
        job = self.pool.job[slot]
        assert job is not None
        self._queued[key] = job
        if job.state is not JobState.QUEUED:
            self._displacement_done(key)
        self._prefetched.add(key)
        self.prefetches.issued += 1
        if self.events.active:
            self.events.emit(PrefetchIssued(key))
        return True

    def _cancel_queued(self) -> None:
        for key, job in list(self._queued.items()):
            if job.state is JobState.QUEUED and self.copier.cancel(job):
                self._undo_prefetch(key, job)
            else:
                self._displacement_done(key)
            if job.state is not JobState.COPYING:
                del self._queued[key]

    def _give_back(self, key: ExpertKey, slot: int) -> None:
        """A cancelled prefetch of ``key`` returns ``slot`` to the expert it displaced, whose
        weights are still there (the copy never started), or frees it."""
        self.pool.clear(slot)
        victim = self._displaced.pop(key, None)
        if victim is not None:
            del self._displaced_by[victim]
            self.pool.assign(slot, victim, None)

    def _reclaim(self, victim: ExpertKey) -> int | None:
        """The slot of ``victim`` if the prefetch that displaced it can still be cancelled."""
        key = self._displaced_by[victim]
        job = self._queued[key]
        if job.state is not JobState.QUEUED or not self.copier.cancel(job):
            self._displacement_done(key)
            return None
        del self._queued[key]
        self._undo_prefetch(key, job)
        return job.slot

    def _undo_prefetch(self, key: ExpertKey, job: CopyJob) -> None:
        """Account for the copy of ``key`` that the copier dropped before it started: a prefetch, or a
        copy left on the books of those on their way by a failed layer or warm-up (no prefetch)."""
        self._give_back(key, job.slot)
        self.phases[job.phase].copied_bytes -= job.nbytes
        self._copies_this_layer -= 1
        if key in self._prefetched:
            self._prefetched.discard(key)
            self.prefetches.cancelled += 1
            if self.events.active:
                self.events.emit(PrefetchCancelled(key))

    def _displacement_done(self, key: ExpertKey) -> None:
        """The copy of ``key`` has started (or is about to): the expert it displaced is evicted."""
        victim = self._displaced.pop(key, None)
        if victim is None:
            return
        del self._displaced_by[victim]
        unused = victim in self._prefetched
        if unused:
            self._prefetched.discard(victim)
            self.prefetches.unused += 1
        if self.events.active:
            self.events.emit(ExpertEvicted(victim, unused))

    def _time_layer(self) -> None:
        now = self.clock()
        if self._last_decode_layer_at is not None:
            sample = now - self._last_decode_layer_at
            compute = max(sample - self._stalled_this_layer, 1e-6)
            demand = self._copies_this_layer * self.copier.seconds_per_copy(self.host.bytes_per_copy)
            load = demand / compute
            if self.layer_seconds is None:
                self.layer_seconds, self.link_load, self.stall_seconds = sample, load, self._stalled_this_layer
            else:
                self.layer_seconds += LAYER_TIME_SMOOTHING * (sample - self.layer_seconds)
                self.link_load += LAYER_TIME_SMOOTHING * (load - self.link_load)
                self.stall_seconds += LAYER_TIME_SMOOTHING * (self._stalled_this_layer - self.stall_seconds)
            self.policy.observe_timing(self.layer_seconds, self.stall_seconds, self.plan_seconds or 0.0, self.link_load)
        self._last_decode_layer_at = now
        self._copies_this_layer = 0
        self._stalled_this_layer = 0.0

    def end_of_generation(self) -> None:
        """The next decode layer does not follow this one in time, and the prefetches still queued
        for it will not be needed by it: they are cancelled. The prefetches copied that no layer of
        the generation used count as unused (a later generation that uses one finds it as any
        expert it holds). A generation that failed between a layer's ``acquire`` and its
        ``release`` left that layer's slots pinned: they are released."""
        self._last_decode_layer_at = None
        self._cancel_queued()
        unused = sorted(self._prefetched)
        self.prefetches.unused += len(unused)
        self._prefetched.clear()
        for slot, pins in enumerate(self.pool.pins):
            if pins:
                self.pool.pins[slot] = 0
                self.copier.release(slot)
        # The events go out once the books are settled: a listener that raises fails the reply,
        # and the next one must find no prefetch counted unused twice and no slot left pinned.
        if self.events.active:
            for key in unused:
                self.events.emit(PrefetchUnused(key))
            # The last snapshot, taken at most every SNAPSHOT_SECONDS while a layer computed, would
            # stay on the live panel until the next reply, showing experts in use and copies that
            # were cancelled: the pool as the reply leaves it replaces it.
            self._settle_queued()
            self.events.emit(self.snapshot(self.policy.layer))

    def _candidates(self, excluded: np.ndarray | None = None) -> np.ndarray:
        """The experts that may be evicted now, as flat indices (``policies.flat_indices``): held in
        a slot that no layer has pinned and that no copy is filling, and not ``excluded``."""
        pool = self.pool
        usable = pool.pins == 0
        # A layer's own misses are pinned until their copies land; every other copy is a prefetch.
        usable[[job.slot for job in self._queued.values() if pool.state(job.slot) is SlotState.LOADING]] = False
        candidates = pool.held[usable]
        candidates = candidates[candidates >= 0]
        return candidates if excluded is None else candidates[~np.isin(candidates, excluded)]

    def _victims(self, excluded: np.ndarray | None = None) -> EvictionQueue:
        return EvictionQueue(self.policy.eviction_order(self._candidates(excluded)))

    def _load(self, key: ExpertKey, phase: str, urgent: bool, slot: int | None = None) -> int:
        """Copy ``key`` into ``slot`` (by default a free one or the policy's victim's) for ``phase``."""
        if slot is None:
            slot = self.pool.free_slot()
        if slot is None:
            slot = self._evict(phase)
        expert = self.host.expert(key)
        job = CopyJob(key=key, slot=slot, write=partial(expert.write_into, self.pool.destinations(slot)),
                      nbytes=expert.nbytes, phase=phase)
        self.phases[job.phase].copied_bytes += job.nbytes
        self.pool.assign(slot, key, job)
        self.copier.submit(job, urgent=urgent)
        self._copies_this_layer += 1
        return slot

    def _evict(self, phase: str) -> int:
        """Free the slot of the policy's choice among the evictable experts, for a demand load of ``phase``."""
        victim = self._victims().peek()
        if victim is None:
            # Prefetches hold every unpinned slot: a demand load outranks them all.
            self._cancel_queued()
            slot = self.pool.free_slot()
            if slot is not None:
                return slot
            victim = self._victims().peek()
            if victim is None:
                loading = list(self._queued.values())
                if not loading:
                    raise RuntimeError("every cache slot is pinned; the cache is below its minimum size")
                self.copier.wait(loading[0], phase)
                self._settle_queued()
                victim = self._victims().peek()
        assert victim is not None
        slot = self.pool.slot_of[victim]
        unused = victim in self._prefetched
        if unused:
            self._prefetched.discard(victim)
            self.prefetches.unused += 1
        self.pool.clear(slot)
        if self.events.active:
            self.events.emit(ExpertEvicted(victim, unused))
        return slot


class EvictionQueue:
    """The victims a policy would evict, in its order, each looked at before it is taken (and
    found only when asked for: finding one costs a pass over the candidates)."""

    def __init__(self, order: Iterator[ExpertKey]) -> None:
        self._order = order
        self._next: ExpertKey | None = None
        self._found = False

    def peek(self) -> ExpertKey | None:
        """The next victim (``None``: none left)."""
        if not self._found:
            self._next, self._found = next(self._order, None), True
        return self._next

    def take(self) -> ExpertKey:
        victim = self.peek()
        assert victim is not None
        self._found = False
        return victim


_SLOT_STATUS = {SlotState.EMPTY: SlotStatus.EMPTY, SlotState.LOADING: SlotStatus.LOADING, SlotState.READY: SlotStatus.READY}
