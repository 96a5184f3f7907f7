"""The expert cache: the slot pool, run by a policy, filled through a copy backend.

``acquire`` is the only way compute gets at an expert: it pins the slots a layer needs,
loads the misses ahead of every queued prefetch and makes compute wait until each slot
is ready. ``release`` unpins them when the layer is done; a pinned slot is never chosen
as a victim, so a layer never computes with weights that are being overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .events import EventBus, ExpertEvicted, LayerRouted
from .policies import Policy
from .store import HostStore, SlotPool, SlotState
from .transfer import Copier, CopyJob, ExpertKey


class ExpertCache:
    def __init__(
        self,
        host: HostStore,
        size: int,
        device: torch.device,
        copier: Copier,
        policy: Policy,
        events: EventBus,
    ) -> None:
        self.host = host
        self.pool = SlotPool(host.layout, size, device)
        self.copier = copier
        self.policy = policy
        self.events = events
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        return self.pool.size

    def acquire(self, layer: int, experts: Sequence[int], prefill: bool) -> list[int]:
        """Pin a ready slot for each of ``experts`` of MoE layer ``layer``."""
        self.policy.observe(layer, experts)
        slots, missed = [], []
        for expert in experts:
            key = (layer, expert)
            slot = self.pool.slot_of.get(key)
            if slot is None:
                missed.append(expert)
                slot = self._load(key, urgent=True)
            self.pool.pins[slot] += 1
            slots.append(slot)
        self.hits += len(experts) - len(missed)
        self.misses += len(missed)
        for slot in slots:
            job = self.pool.job[slot]
            if job is not None:
                self.copier.wait(job)
        if self.events.active:
            self.events.emit(LayerRouted(layer, tuple(experts), tuple(missed), prefill))
        return slots

    def release(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self.pool.pins[slot] -= 1
            self.copier.release(slot)

    def _load(self, key: ExpertKey, urgent: bool) -> int:
        slot = self.pool.free_slot()
        if slot is None:
            slot = self._evict()
        job = CopyJob(
            key=key,
            slot=slot,
            pairs=list(zip(self.pool.destinations(slot), self.host.sources(key))),
            nbytes=self.host.layout.bytes_per_expert,
        )
        self.pool.assign(slot, key, job)
        self.copier.submit(job, urgent=urgent)
        return slot

    def _evict(self) -> int:
        candidates = [
            key
            for slot, key in enumerate(self.pool.owner)
            if key is not None and self.pool.pins[slot] == 0 and self.pool.state(slot) is SlotState.READY
        ]
        if not candidates:
            raise RuntimeError("every cache slot is pinned or loading; the cache is below its minimum size")
        victim = self.policy.victim(candidates)
        slot = self.pool.slot_of[victim]
        self.pool.clear(slot)
        if self.events.active:
            self.events.emit(ExpertEvicted(victim))
        return slot
