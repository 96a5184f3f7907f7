"""The engine's event stream: what a live panel, a log or a test needs to follow the cache.

Events are small immutable records handed to listeners on the generating thread. A
listener must return quickly; an ``EventBuffer`` is the listener to use from another
thread (a GUI): it queues events in a bounded buffer that the other thread drains. A
listener that raises fails the call under way (a reply is lost with it), and leaves the
engine ready for the next.

When nobody listens, the engine builds no event at all (every emission is guarded by
``EventBus.active``), so the stream costs nothing unless it is used.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .transfer import ExpertKey


@dataclass(frozen=True)
class LayerRouted:
    """MoE layer ``layer`` of the current step needs ``experts``; ``missed`` were in no slot (each
    is copied now), ``late`` on their way (prefetches not landed: the layer waits for them)."""

    layer: int
    experts: tuple[int, ...]
    missed: tuple[int, ...]
    prefill: bool
    late: tuple[int, ...] = ()

    @property
    def hits(self) -> int:
        """The experts found ready in their slots."""
        return len(self.experts) - len(self.missed) - len(self.late)


@dataclass(frozen=True)
class ExpertsForecast:
    """After layer ``layer`` routed: the probability of each forecast (layer, expert)."""

    layer: int
    probabilities: tuple[tuple[ExpertKey, float], ...]


@dataclass(frozen=True)
class PrefetchIssued:
    key: ExpertKey


@dataclass(frozen=True)
class PrefetchCompleted:
    """A prefetched expert is in its slot (noticed at the next layer boundary)."""

    key: ExpertKey


@dataclass(frozen=True)
class PrefetchCancelled:
    """A re-plan dropped a queued prefetch before its copy started."""

    key: ExpertKey


@dataclass(frozen=True)
class PrefetchUnused:
    """The generation ended without any of its layers using this prefetched expert (it stays in
    the cache; one evicted unused is an ``ExpertEvicted`` instead)."""

    key: ExpertKey


@dataclass(frozen=True)
class ExpertEvicted:
    key: ExpertKey
    unused: bool
    """It was prefetched and leaves without any layer having used it."""


@dataclass(frozen=True)
class Stall:
    """Compute waited ``seconds`` for expert ``key``: a ``miss`` or a ``late prefetch``.

    On CUDA the duration is measured with events on the compute stream, so a stall is
    reported a few layers after it happened, once the GPU has passed it.
    """

    key: ExpertKey
    seconds: float
    cause: str
    prefill: bool


class SlotStatus(Enum):
    EMPTY = "empty"
    LOADING = "loading"
    READY = "ready"
    IN_USE = "in use"


@dataclass(frozen=True)
class CacheSnapshot:
    """What every slot of the pool holds, taken while layer ``layer`` computes (its experts in use)."""

    layer: int
    owners: tuple[ExpertKey | None, ...]
    states: tuple[SlotStatus, ...]


@dataclass(frozen=True)
class TokenGenerated:
    index: int
    token_id: int
    seconds: float
    """Since the start of the generation."""


Event = (
    LayerRouted
    | ExpertsForecast
    | PrefetchIssued
    | PrefetchCompleted
    | PrefetchCancelled
    | PrefetchUnused
    | ExpertEvicted
    | Stall
    | CacheSnapshot
    | TokenGenerated
)
Listener = Callable[[Event], None]


class EventBus:
    """Listeners may subscribe and unsubscribe from any thread, also during a generation."""

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> None:
        """Hear every event from now on; a listener already subscribed stays so, and hears each once."""
        if not callable(listener):  # else the next layer of a reply would fail calling it
            raise TypeError(f"a listener is called with each event; {listener!r} cannot be called")
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: Listener) -> None:
        """Hear no more events; nothing happens for a listener not subscribed."""
        with self._lock:
            self._listeners = tuple(known for known in self._listeners if known != listener)

    def emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    @property
    def active(self) -> bool:
        return bool(self._listeners)


class EventBuffer:
    """A bounded, thread-safe queue of events: subscribe it, then ``drain`` from any thread.

    When the consumer falls behind, the oldest events are dropped (and counted), so a slow
    or paused consumer never slows generation or grows memory.
    """

    def __init__(self, capacity: int = 65536) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.dropped = 0

    def __call__(self, event: Event) -> None:
        with self._lock:
            if len(self._events) == self._events.maxlen:
                self.dropped += 1
            self._events.append(event)

    def drain(self) -> list[Event]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events
