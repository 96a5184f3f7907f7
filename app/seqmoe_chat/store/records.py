"""The records the chat database holds, as plain dataclasses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

USER = "user"
ASSISTANT = "assistant"
ROLES = (USER, ASSISTANT)

# A reply's life: streaming while tokens arrive, then exactly one of the others.
STREAMING = "streaming"
DONE = "done"
STOPPED = "stopped"
FAILED = "failed"
INTERRUPTED = "interrupted"  # the app ended while the reply was streaming
STATES = (STREAMING, DONE, STOPPED, FAILED, INTERRUPTED)


def now_iso() -> str:
    """UTC timestamps as fixed-width ISO strings: they sort as text and survive JSON unchanged."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


TEMPERATURES = (0.0, 2.0)
TOP_PS = (0.05, 1.0)
MAX_NEW_TOKENS = (1, 32_768)
SEEDS = (0, 2**31 - 1)


@dataclass
class SamplingSettings:
    """How replies are sampled. A temperature of 0 means greedy decoding; no seed means a random one."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 512
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingSettings:
        """From stored values; one of the wrong type or outside its range (a hand-edited file)
        keeps its default, as the settings dialog could not have given it."""
        defaults = cls()
        seed = values.get("seed")
        return cls(
            temperature=within(values.get("temperature"), TEMPERATURES, defaults.temperature, float),
            top_p=within(values.get("top_p"), TOP_PS, defaults.top_p, float),
            max_new_tokens=within(values.get("max_new_tokens"), MAX_NEW_TOKENS, defaults.max_new_tokens, int),
            seed=None if seed is None else within(seed, SEEDS, defaults.seed, int),
        )


def is_number(value: Any) -> bool:
    """A number a float can hold: JSON's NaN, 1e400 (infinity) or a 400-digit integer is no
    count, speed or setting, and formatting one as a float would raise."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def within(value: object, bounds: tuple[float, float], default: Any, kind: type) -> Any:
    """``value`` as ``kind`` when it is one (an int for ``int``, else a finite number) within
    ``bounds``; else ``default``."""
    exact = isinstance(value, int) and not isinstance(value, bool) if kind is int else is_number(value)
    if not exact or not bounds[0] <= value <= bounds[1]:
        return default
    return kind(value)


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    sampling: SamplingSettings
    model_id: str
    current_leaf_id: int | None
    created_at: str
    updated_at: str


@dataclass
class ConversationSummary:
    """A row of the conversation list; ``snippet`` is the matching text when searching."""

    id: int
    title: str
    updated_at: str
    snippet: str = ""


@dataclass
class Message:
    """One message. Messages form a tree through ``parent_id``: an edited message or a
    regenerated reply is a sibling of the earlier version, which stays in the tree."""

    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    created_at: str
    updated_at: str
    state: str = DONE
    error: str = ""
    model_id: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class ThreadEntry:
    """A message of the visible thread and which of its versions it is (1-based)."""

    message: Message
    version: int
    versions: int
    sibling_ids: list[int]
