"""Statistics of one generation, with the key names the command line promises."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TypeVar


Empty = TypeVar("Empty", float, None)


def hits_share(hits: float, late: float, misses: float, empty: Empty) -> float | Empty:
    """The share of the experts the layers used that were ready in their slots when asked for:
    neither on their way (``late``) nor copied then (``misses``); ``empty`` if none was used."""
    accesses = hits + late + misses
    return hits / accesses if accesses else empty


def late_share(hits: float, late: float, misses: float, empty: Empty) -> float | Empty:
    """The share of the experts the layers used that were still on their way when asked for."""
    accesses = hits + late + misses
    return late / accesses if accesses else empty


@dataclass
class GenerationStats:
    tokens: int
    seconds: float
    hits: int
    misses: int
    stall_seconds: float
    h2d_bytes: int
    cache_slots: int
    total_experts: int
    policy: str
    device: str
    link: str
    link_setup: str | None = None
    """The consumer setup the emulated link was matched to (``Engine.link_setup``)."""
    link_gbps: float | None = None
    """The emulated link's speed; None on a real link."""
    bytes_per_copy: float = 0.0
    """What one expert's copy moved over the link, on average (``HostStore.bytes_per_copy``:
    less than a slot's bytes when the experts are packed)."""
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    """The prompt's first tokens whose keys and values the previous reply's cache held (no prefill)."""
    time_to_first_token: float = 0.0
    prefill_h2d_bytes: int = 0
    decode_h2d_bytes: int = 0
    """The copies each phase asked for (``h2d_bytes`` is what the link carried: the same once
    the generation's queued prefetches are cancelled at its end)."""
    late: int = 0
    """Experts found on their way (prefetches not landed), neither hits nor misses (``cache.PhaseCounters``)."""
    prefill_hits: int = 0
    prefill_late: int = 0
    prefill_misses: int = 0
    prefill_stall_seconds: float = 0.0
    decode_hits: int = 0
    decode_late: int = 0
    decode_misses: int = 0
    decode_stall_seconds: float = 0.0
    prefetch_issued: int = 0
    prefetch_unused: int = 0
    context_full: bool = False
    """The reply stopped because prompt and reply filled the context, before its token limit."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second after the first: the decode speed without prefill."""
        decode_seconds = self.seconds - self.time_to_first_token
        return (self.tokens - 1) / decode_seconds if self.tokens > 1 and decode_seconds > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        """``hits_share`` of the prompt and the reply; 1 when no expert was used (nothing was missed)."""
        return hits_share(self.hits, self.late, self.misses, empty=1.0)

    @property
    def decode_hit_rate(self) -> float:
        return hits_share(self.decode_hits, self.decode_late, self.decode_misses, empty=1.0)

    @property
    def unused_prefetch_fraction(self) -> float:
        return self.prefetch_unused / self.prefetch_issued if self.prefetch_issued else 0.0

    @property
    def cache_ratio(self) -> float:
        return self.cache_slots / self.total_experts

    def as_dict(self) -> dict[str, object]:
        values = asdict(self)
        values.update(
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            hit_rate=self.hit_rate,
            decode_hit_rate=self.decode_hit_rate,
            unused_prefetch_fraction=self.unused_prefetch_fraction,
            cache_ratio=self.cache_ratio,
        )
        return values

    def summary(self) -> str:
        return (
            f"{self.tokens} tokens in {self.seconds:.2f} s ({self.tokens_per_s:.1f} tok/s), "
            f"policy {self.policy}, cache {self.cache_slots}/{self.total_experts} experts "
            f"({self.cache_ratio:.0%}), hit rate {self.hit_rate:.1%}, stalls {self.stall_seconds:.3f} s, "
            f"H2D {self.h2d_bytes / 2**20:.1f} MiB, {self.device} ({self.link} link)"
        )
