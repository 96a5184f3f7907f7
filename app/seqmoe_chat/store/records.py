"""The records the chat database holds, as plain dataclasses."""

from __future__ import annotations

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
        defaults = cls()
        seed = values.get("seed", defaults.seed)
        return cls(
            temperature=float(values.get("temperature", defaults.temperature)),
            top_p=float(values.get("top_p", defaults.top_p)),
            max_new_tokens=int(values.get("max_new_tokens", defaults.max_new_tokens)),
            seed=None if seed is None else int(seed),
        )


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
