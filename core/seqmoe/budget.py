"""How many expert slots a cache ratio or a device-memory budget buys.

A budget pays, in order, for the resident (non-expert) weights, a KV-cache reserve for
``context_tokens`` tokens, and a workspace for activations and allocator slack; what is
left, divided by one expert's bytes, is the slot count.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from .errors import BudgetTooSmall
from .gib import GIB, gib_rounded_up
from .layer_configs import layer_configs

DEFAULT_CONTEXT_TOKENS = 4096
"""Tokens of prompt and reply the engine holds unless told otherwise (a chat's worth, as local
chat apps default to); the KV cache for them is what a budget sets aside."""
WORKSPACE_BYTES = {"cuda": 512 * 2**20, "cpu": 64 * 2**20}
"""CUDA reserves room for its context, cuBLAS workspaces and allocator fragmentation."""
FREE_MEMORY_MARGIN = 0.1
"""Share of a device's free memory that a budget sized to it leaves out: for other programs, the
CUDA context's growth and fragmentation beyond ``WORKSPACE_BYTES``."""


def context_held(requested: int, limit: int | None) -> int:
    """The context the engine holds for ``requested`` tokens: past the model's own ``limit`` (when
    its config gives one) its positions mean nothing."""
    return min(requested, limit) if limit else requested


def budget_for_free_memory(held_bytes: int, free_bytes: int) -> int:
    """A budget sized to the device: what this process holds on it and most of its free memory."""
    return held_bytes + int((1 - FREE_MEMORY_MARGIN) * free_bytes)


@dataclass(frozen=True)
class CacheGeometry:
    """The numbers that size a cache for one loaded model on one device."""

    total_experts: int
    bytes_per_expert: int
    resident_bytes: int
    kv_bytes: int
    workspace_bytes: int
    top_k: int

    @property
    def minimum_slots(self) -> int:
        return minimum_slots(self.total_experts, self.top_k)

    def budget_bytes_for(self, slots: int) -> int:
        return self.resident_bytes + self.kv_bytes + self.workspace_bytes + slots * self.bytes_per_expert

    def slots_for_ratio(self, ratio: float) -> int:
        if not 0 < ratio <= 1:
            raise BudgetTooSmall(f"cache ratio must be in (0, 1], got {ratio}")
        return self._checked(ratio_slots(ratio, self.total_experts), ratio=ratio)

    def slots_for_budget(self, budget_bytes: int) -> int:
        spare = budget_bytes - self.resident_bytes - self.kv_bytes - self.workspace_bytes
        slots = max(spare, 0) // self.bytes_per_expert
        return self._checked(min(slots, self.total_experts), budget_bytes=budget_bytes)

    def _checked(self, slots: int, ratio: float | None = None, budget_bytes: int | None = None) -> int:
        if slots < self.minimum_slots:
            least_bytes = self.budget_bytes_for(self.minimum_slots)
            decimals = 2 if budget_bytes is None else _decimals_telling_apart(budget_bytes, least_bytes)
            asked = f"cache ratio {ratio}" if budget_bytes is None else f"a budget of {_gib_above_zero(budget_bytes, decimals)} GiB"
            raise BudgetTooSmall(f"{too_few_slots(asked, slots, self.total_experts, self.top_k)} or a VRAM budget "
                                 f"of at least {gib_rounded_up(least_bytes, decimals):.{decimals}f} GiB")
        return slots


def minimum_slots(total_experts: int, top_k: int) -> int:
    """One decode step of one layer needs ``top_k`` experts; one more leaves room to prefetch."""
    return min(top_k + 1, total_experts)


def ratio_slots(ratio: float, total_experts: int) -> int:
    """The slots a cache of ``ratio`` of all experts has: the nearest whole number."""
    return round(ratio * total_experts)


def too_few_slots(asked: str, slots: int, total_experts: int, top_k: int) -> str:
    """Why the ``slots`` that ``asked`` leaves are too few, and the least cache ratio that is enough."""
    need = minimum_slots(total_experts, top_k)
    why = f"top-k {top_k} + 1" if need == top_k + 1 else f"all its experts: top-k {top_k}"
    # The least ratio of two decimals that rounds to enough slots (0.02 of 128 experts gives 3).
    least = next(ratio for ratio in (h / 100 for h in range(1, 101)) if ratio_slots(ratio, total_experts) >= need)
    return (f"{asked} leaves {slots} expert slots, below this model's minimum of {need} ({why}): "
            f"it needs a cache ratio of at least {least:.2f}")


def _decimals_telling_apart(asked: int, least: int) -> int:
    """As few decimals (2 to 4) as show a budget and the least that works as different figures:
    "0.02 GiB leaves too few slots, it needs at least 0.02 GiB" helps nobody."""
    return next((d for d in (2, 3) if f"{asked / GIB:.{d}f}" != f"{gib_rounded_up(least, d):.{d}f}"), 4)


def _gib_above_zero(size: int, decimals: int) -> str:
    """``size`` bytes in GiB at ``decimals``, or at as many more as it takes not to read 0: a budget
    saved as 0.001 read "a budget of 0.00 GiB", as if no budget were set."""
    decimals = next((d for d in range(decimals, 10) if round(size / GIB, d) > 0), decimals)
    return f"{size / GIB:.{decimals}f}"


def kv_cache_bytes(config: PretrainedConfig, context_tokens: int, element_size: int) -> int:
    """Keys and values of every attention layer for ``context_tokens`` tokens (an upper estimate)."""
    return sum(_kv_values_per_token(layer) for layer in layer_configs(config)) * context_tokens * element_size


def _kv_values_per_token(layer: PretrainedConfig) -> int:
    heads = getattr(layer, "num_attention_heads", 1)
    kv_heads = getattr(layer, "num_key_value_heads", None) or heads
    head_dim = getattr(layer, "head_dim", None) or layer.hidden_size // heads
    if getattr(layer, "qk_nope_head_dim", None):
        # Multi-head latent attention: transformers caches the decompressed keys and values.
        return heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim + layer.v_head_dim)
    return 2 * kv_heads * head_dim
