"""Cache policies: which experts to load ahead of time and which to evict.

A policy sees every access (``observe``), may ask for prefetches after each MoE layer
(``plan``) and chooses victims (``victim``). The experts function never sees a policy;
it only asks the cache for slots. Later policies (``gate``, ``seqmoe``, ``oracle``)
implement the same three methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .transfer import ExpertKey

POLICY_NAMES = ("full", "lru")


@dataclass(frozen=True)
class Prefetch:
    """A request to load ``key`` before MoE layer ``key[0]`` runs, worth ``score``."""

    key: ExpertKey
    score: float


class Policy:
    """Base policy: reactive loading (no prefetch) and least-recently-used eviction."""

    name = "base"

    def __init__(self) -> None:
        self._last_use: dict[ExpertKey, int] = {}
        self._clock = 0

    def observe(self, layer: int, experts: Sequence[int]) -> None:
        """Record that MoE layer ``layer`` uses ``experts`` now."""
        self._clock += 1
        for expert in experts:
            self._last_use[(layer, expert)] = self._clock

    def plan(self, layer: int, hidden_states: torch.Tensor) -> Sequence[Prefetch]:
        """Prefetches to queue after layer ``layer`` has been routed; none for reactive policies."""
        return ()

    def victim(self, candidates: Sequence[ExpertKey]) -> ExpertKey:
        """The resident expert to evict; ties go to the lowest (layer, expert)."""
        return min(candidates, key=lambda key: (self._last_use.get(key, 0), key))


class LRUPolicy(Policy):
    """Reactive offloading: load on a miss, evict the least recently used expert."""

    name = "lru"


class FullPolicy(Policy):
    """Every expert resident: the all-in-VRAM reference; nothing is ever evicted."""

    name = "full"

    def victim(self, candidates: Sequence[ExpertKey]) -> ExpertKey:
        raise RuntimeError("the full policy keeps every expert resident and never evicts")


def make_policy(name: str) -> Policy:
    policies = {cls.name: cls for cls in (FullPolicy, LRUPolicy)}
    if name not in policies:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return policies[name]()
