"""What the live panel shows, folded from the engine's event stream. No Qt in here.

The GUI drains an ``EventBuffer`` a few times a second and hands the batch to ``fold``;
the views then paint from this object once. A generation starts with its prefill (the
first prefill routing after decode steps); the cache map and the latest forecasts carry
over from one generation to the next, the counters, recall and stalls do not.

Token indices: the prefill pass produces token 0, the decode pass after ``TokenGenerated(i)``
produces token ``i + 1``; routing and stalls are charged to the token being produced.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    # Only for the types: importing seqmoe loads PyTorch, which the window must not wait for.
    from seqmoe.events import (
        CacheSnapshot,
        Event,
        ExpertEvicted,
        ExpertsForecast,
        LayerRouted,
        PrefetchCancelled,
        PrefetchCompleted,
        PrefetchIssued,
        PrefetchUnused,
        Stall,
        TokenGenerated,
    )

NOT_CACHED, LOADING, READY, IN_USE = range(4)
CELL_STATES = ("not cached", "loading", "ready", "in use")
_CELL_OF_SLOT = {"empty": NOT_CACHED, "loading": LOADING, "ready": READY, "in use": IN_USE}  # SlotStatus values
RECENT_STALLS = 50
NEVER = -1


@dataclass(frozen=True)
class StallRecord:
    token: int
    layer: int
    expert: int
    seconds: float
    cause: str  # "miss" or "late prefetch"
    prefill: bool


@dataclass
class Counters:
    """Totals of the current generation."""

    tokens: int = 0
    seconds: float = 0.0  # from the start of the generation to its latest token
    first_token_seconds: float | None = None
    hits: int = 0  # prompt and reply; ready when asked for
    late: int = 0  # prefetches not landed when asked for
    misses: int = 0  # copied when asked for
    decode_hits: int = 0  # generating, after the first token
    decode_late: int = 0
    decode_misses: int = 0
    prefetch_issued: int = 0
    prefetch_cancelled: int = 0
    prefetch_completed: int = 0
    prefetch_used: int = 0
    prefetch_unused: int = 0
    stalls: int = 0
    stall_seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """After the first token, as the reply's own figures (``reply_stats.generating``)."""
        if self.first_token_seconds is None or self.tokens < 2 or self.seconds <= self.first_token_seconds:
            return None
        return (self.tokens - 1) / (self.seconds - self.first_token_seconds)

    @property
    def hit_rate(self) -> float | None:
        accesses = self.hits + self.late + self.misses
        return self.hits / accesses if accesses else None

    @property
    def decode_hit_rate(self) -> float | None:
        accesses = self.decode_hits + self.decode_late + self.decode_misses
        return self.decode_hits / accesses if accesses else None

    @property
    def prefetch_copies(self) -> int:
        """Prefetches whose copy went ahead (a cancelled one never moved a byte)."""
        return self.prefetch_issued - self.prefetch_cancelled

    @property
    def prefetch_precision(self) -> float | None:
        """Used prefetches per copied one. A late prefetch that is used counts although it had
        not completed when its layer ran, so the copies, not the completions, are the base."""
        return self.prefetch_used / self.prefetch_copies if self.prefetch_copies else None

    @property
    def copies(self) -> int:
        """Every expert copied to the device: prefetches and on-demand loads after a miss."""
        return self.prefetch_copies + self.misses


@dataclass
class RecallTally:
    """recall@k at one horizon: routed experts found among the k most probable forecast ones."""

    found: int = 0
    routed: int = 0

    @property
    def recall(self) -> float | None:
        return self.found / self.routed if self.routed else None


@dataclass
class TelemetryModel:
    num_layers: int
    num_experts: int
    bytes_per_copy: float  # what one expert's copy moves over the link (packed experts move less than they take)
    all_resident: bool = False  # the full policy: every expert stays on the device, no cache events
    cached: Sequence[tuple[int, int]] = ()  # (layer, expert) in the cache before any event (configure fills it)
    counters: Counters = field(default_factory=Counters)
    recall: dict[int, RecallTally] = field(default_factory=dict)
    stall_per_token: list[float] = field(default_factory=list)
    recent_stalls: deque[StallRecord] = field(default_factory=lambda: deque(maxlen=RECENT_STALLS))
    generations: int = 0
    events_folded: int = 0
    serial: int = 0  # grows whenever a fold changed something, so views repaint only then

    def __post_init__(self) -> None:
        shape = (self.num_layers, self.num_experts)
        self.show_cached(self.cached)
        self.last_use = np.full(shape, NEVER, dtype=np.int32)
        self.probability = np.full(shape, np.nan, dtype=np.float32)  # the latest forecast; NaN: none yet
        self.predicted = np.full(shape, np.nan, dtype=np.float32)  # the forecast each layer had when it routed; NaN: none
        self.routed: list[tuple[int, ...]] = [() for _ in range(self.num_layers)]  # at the current token
        self._pending: dict[int, dict[int, dict[int, float]]] = {}  # target layer -> horizon -> expert -> p
        self._outstanding: set[tuple[int, int]] = set()  # prefetched, neither used, cancelled nor evicted
        self._token = 0
        self._in_prefill = False
        # By class name, so that this module does not import the engine (see the imports).
        self._handlers = {
            "LayerRouted": self._routed,
            "ExpertsForecast": self._forecast,
            "PrefetchIssued": self._issued,
            "PrefetchCompleted": self._completed,
            "PrefetchCancelled": self._cancelled,
            "ExpertEvicted": self._evicted,
            "PrefetchUnused": self._unused,
            "Stall": self._stall,
            "TokenGenerated": self._token_generated,
        }

    def show_cached(self, cached: Sequence[tuple[int, int]]) -> None:
        """The cache map as the engine reports it between generations: ``cached`` ready, the rest not cached."""
        self.cells = np.full((self.num_layers, self.num_experts), READY if self.all_resident else NOT_CACHED, dtype=np.int8)
        for key in cached:
            self.cells[key] = READY
        self.serial += 1

    def fold(self, events: list[Event]) -> None:
        """Take a drained batch of events, oldest first."""
        if not events:
            return
        latest_snapshot: CacheSnapshot | None = None
        for event in events:
            kind = type(event).__name__
            if kind == "CacheSnapshot":
                # A snapshot is the whole pool: only the batch's last one matters.
                latest_snapshot = event
                continue
            handler = self._handlers.get(kind)
            if handler is not None:
                handler(event)
        if latest_snapshot is not None:
            self._snapshot(latest_snapshot)
        self.events_folded += len(events)
        self.serial += 1

    # Queries for the views

    def cell_counts(self) -> dict[str, int]:
        counts = np.bincount(self.cells.ravel(), minlength=len(CELL_STATES))
        return {name: int(count) for name, count in zip(CELL_STATES, counts)}

    def describe_cell(self, layer: int, expert: int) -> str:
        used = int(self.last_use[layer, expert])
        probability = float(self.probability[layer, expert])
        lines = [
            f"layer {layer}, expert {expert}: {CELL_STATES[self.cells[layer, expert]]}",
            f"last used at token {used}" if used != NEVER else "not used yet",
            f"predicted probability {probability:.2f}" if not np.isnan(probability) else "no forecast yet",
        ]
        return "\n".join(lines)

    def engine_bytes_per_s(self) -> float | None:
        """Bytes copied to the device per second of this generation, from the event counts."""
        seconds = self.counters.seconds
        return self.counters.copies * self.bytes_per_copy / seconds if seconds > 0 else None

    def summary(self) -> dict[str, Any]:
        """The current generation's figures as plain JSON values."""
        counters = self.counters
        return {
            "generation": self.generations,
            "layers": self.num_layers,
            "experts_per_layer": self.num_experts,
            "counters": asdict(counters),
            "tokens_per_s": counters.tokens_per_s,
            "decode_tokens_per_s": counters.decode_tokens_per_s,
            "hit_rate": counters.hit_rate,
            "decode_hit_rate": counters.decode_hit_rate,
            "prefetch_precision": counters.prefetch_precision,
            "engine_bytes_per_s": self.engine_bytes_per_s(),
            "recall_at_k": {str(h): tally.recall for h, tally in sorted(self.recall.items())},
            "stall_seconds_per_token": list(self.stall_per_token),
            "recent_stalls": [asdict(stall) for stall in self.recent_stalls],
            "cache_cells": self.cell_counts(),
        }

    # Folding, one handler per event type

    def _new_generation(self) -> None:
        self.generations += 1
        self.counters = Counters()
        self.recall = {}
        self.stall_per_token = []
        self.recent_stalls.clear()
        self.predicted[:] = np.nan
        self.routed = [() for _ in range(self.num_layers)]
        self._pending.clear()
        self._outstanding.clear()
        self._token = 0

    def _routed(self, event: LayerRouted) -> None:
        if event.prefill and not self._in_prefill:
            self._new_generation()
        self._in_prefill = event.prefill
        counters = self.counters
        counters.hits += event.hits
        counters.late += len(event.late)
        counters.misses += len(event.missed)
        layer = event.layer
        self.last_use[layer, list(event.experts)] = self._token
        for expert in event.experts:
            key = (layer, expert)
            if key in self._outstanding:
                self._outstanding.discard(key)
                counters.prefetch_used += 1
        if event.prefill:
            # Prefill streams whole layers instead of forecasting; what was forecast before is void.
            self._pending.clear()
            return
        counters.decode_hits += event.hits
        counters.decode_late += len(event.late)
        counters.decode_misses += len(event.missed)
        self.routed[layer] = event.experts
        forecasts = self._pending.pop(layer, {})
        self.predicted[layer] = 0.0 if forecasts else np.nan
        if not forecasts:
            return
        routed, k = set(event.experts), len(event.experts)
        for horizon, probabilities in forecasts.items():
            best = sorted(probabilities, key=probabilities.__getitem__, reverse=True)[:k]
            tally = self.recall.setdefault(horizon, RecallTally())
            tally.found += len(routed.intersection(best))
            tally.routed += k
        # The nearest forecast is the one the prefetches for this layer last followed.
        nearest = forecasts[min(forecasts)]
        self.predicted[layer, list(nearest)] = list(nearest.values())

    def _forecast(self, event: ExpertsForecast) -> None:
        by_target: dict[int, dict[int, float]] = {}
        for (target, expert), probability in event.probabilities:
            by_target.setdefault(target, {})[expert] = probability
        for target, probabilities in by_target.items():
            # Horizon h forecasts layer (l + h) mod L; past the last layer it is the next token's.
            horizon = (target - event.layer) % self.num_layers or self.num_layers
            self._pending.setdefault(target, {})[horizon] = probabilities
            row = self.probability[target]
            row[:] = 0.0
            row[list(probabilities)] = list(probabilities.values())

    def _issued(self, event: PrefetchIssued) -> None:
        self.counters.prefetch_issued += 1
        self._outstanding.add(event.key)

    def _completed(self, _event: PrefetchCompleted) -> None:
        self.counters.prefetch_completed += 1

    def _cancelled(self, event: PrefetchCancelled) -> None:
        self.counters.prefetch_cancelled += 1
        self._outstanding.discard(event.key)

    def _evicted(self, event: ExpertEvicted) -> None:
        if event.unused:
            self.counters.prefetch_unused += 1
        self._outstanding.discard(event.key)

    def _unused(self, event: PrefetchUnused) -> None:
        self.counters.prefetch_unused += 1
        self._outstanding.discard(event.key)

    def _stall(self, event: Stall) -> None:
        counters = self.counters
        counters.stalls += 1
        counters.stall_seconds += event.seconds
        self._grow_timeline(self._token + 1)
        self.stall_per_token[self._token] += event.seconds
        layer, expert = event.key
        self.recent_stalls.appendleft(StallRecord(self._token, layer, expert, event.seconds, event.cause, event.prefill))

    def _token_generated(self, event: TokenGenerated) -> None:
        if event.index + 1 < self.counters.tokens:
            self._new_generation()  # the panel was hidden when this generation's prefill ran
        # A token ends the prefill, also of a reply that ends before any decode layer runs.
        self._in_prefill = False
        self.counters.tokens = event.index + 1
        self.counters.seconds = event.seconds
        if event.index == 0:
            self.counters.first_token_seconds = event.seconds
        self._token = event.index + 1
        self._grow_timeline(self._token)

    def _grow_timeline(self, tokens: int) -> None:
        if tokens > len(self.stall_per_token):
            self.stall_per_token.extend([0.0] * (tokens - len(self.stall_per_token)))

    def _snapshot(self, event: CacheSnapshot) -> None:
        cells = np.full_like(self.cells, NOT_CACHED)
        for owner, status in zip(event.owners, event.states):
            if owner is not None:
                cells[owner] = _CELL_OF_SLOT[status.value]
        self.cells = cells
