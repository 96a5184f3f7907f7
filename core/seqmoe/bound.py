"""The fewest expert copies any cache policy can make for a run's decode, and the speed they allow.

On a miss, Belady's MIN evicts the resident expert whose next use is farthest (one never used
again first); for the same accesses and cache size no policy misses less (Belady, 1966). A
prefetch only moves a copy earlier, it never saves one. The bound runs MIN on each reply's
decode alone, its cache filled for free at the start with the experts the reply needs first
(what the best policy could have loaded during prefill), so it bounds every policy's decode
copies, the oracles' included, and with them the decode speed: the one link carries a
token's copies while its layers compute.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .transfer import ExpertKey


@dataclass(frozen=True)
class Access:
    """One step's need for the experts of one MoE layer, as the cache is asked for it."""

    layer: int
    experts: tuple[int, ...]
    decode: bool


@dataclass(frozen=True)
class CopyBound:
    """What no policy can pass at one cache size."""

    cache_ratio: float
    copies_per_token: float
    """The fewest experts any policy copies during decode, per decode token."""
    ratio_to_full: float
    """The decode speed those copies allow if every one overlapped compute."""

    @classmethod
    def of(cls, cache_ratio: float, copies: int, tokens: int, num_layers: int, copy_layers: float) -> CopyBound:
        """The bound of ``copies`` over ``tokens`` decode tokens when one copy takes ``copy_layers``
        layers of decode compute."""
        per_token = copies / max(tokens, 1)
        return cls(cache_ratio, per_token, min(1.0, num_layers / (per_token * copy_layers)) if per_token else 1.0)

    @property
    def summary(self) -> str:
        return (f"at most {self.ratio_to_full:.1%} of full at cache ratio {self.cache_ratio:.2f}: no policy copies fewer "
                f"than {self.copies_per_token:.2f} experts per decode token (Belady's MIN), each taking the link alone")

    def as_dict(self) -> dict[str, float]:
        return {
            "cache_ratio": self.cache_ratio,
            "min_copies_per_token": self.copies_per_token,
            "copy_bound_ratio_to_full": self.ratio_to_full,
        }


def fewest_copies(accesses: Sequence[Access], slots: int) -> tuple[int, int]:
    """(copies, decode tokens) of MIN with ``slots`` slots on each run of consecutive decode
    accesses, the first ``slots`` experts loaded free; a decode token is a decode access of layer 0."""
    copies = tokens = 0
    for decode, group in itertools.groupby(accesses, key=lambda access: access.decode):
        if decode:
            reply = list(group)
            copies += _min_misses(reply, slots)
            tokens += sum(access.layer == 0 for access in reply)
    return copies, tokens


def _min_misses(accesses: Sequence[Access], slots: int) -> int:
    """Misses of MIN beyond the first ``slots`` (those fill the cache free)."""
    uses: dict[ExpertKey, deque[int]] = {}
    for position, access in enumerate(accesses):
        for expert in access.experts:
            uses.setdefault((access.layer, expert), deque()).append(position)
    never = len(accesses)
    resident: set[ExpertKey] = set()
    misses = 0
    for access in accesses:
        needed = {(access.layer, expert) for expert in access.experts}
        for key in needed:
            uses[key].popleft()
        for key in needed - resident:
            if len(resident) >= slots:
                resident.remove(max(resident - needed, key=lambda k: uses[k][0] if uses[k] else never))
                misses += 1
            resident.add(key)
    return misses
