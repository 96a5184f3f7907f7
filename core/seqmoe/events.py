"""The engine's event stream: what a live panel or a log needs to follow the cache.

Events are small immutable records handed to listeners on the generating thread; a
listener must return quickly (queue the event, never render from it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .transfer import ExpertKey


@dataclass(frozen=True)
class LayerRouted:
    """MoE layer ``layer`` of the current step needs ``experts``; ``missed`` were not resident."""

    layer: int
    experts: tuple[int, ...]
    missed: tuple[int, ...]
    prefill: bool


@dataclass(frozen=True)
class ExpertEvicted:
    key: ExpertKey


@dataclass(frozen=True)
class PrefetchIssued:
    key: ExpertKey


@dataclass(frozen=True)
class PrefetchCancelled:
    key: ExpertKey


@dataclass(frozen=True)
class ExpertsForecast:
    """After layer ``layer`` routed: the probability of each forecast (layer, expert)."""

    layer: int
    probabilities: tuple[tuple[ExpertKey, float], ...]


@dataclass(frozen=True)
class TokenGenerated:
    index: int
    token_id: int
    seconds: float


Event = LayerRouted | ExpertEvicted | PrefetchIssued | PrefetchCancelled | ExpertsForecast | TokenGenerated
Listener = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    @property
    def active(self) -> bool:
        return bool(self._listeners)
