"""Whether a model fits this computer: all in VRAM, offloaded with SeqMoE at some cache
ratio, or not at all. The arithmetic is the engine's own (``seqmoe.budget.CacheGeometry``),
applied to figures known before the model is downloaded."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..engine_import import import_engine
from .model_shape import ModelShape

EMULATED_VRAM_BYTES = 8 * 2**30
"""Without a CUDA GPU the engine emulates one; fits are judged for a common 8 GiB card."""


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "cuda" or "emulated"
    name: str
    vram_bytes: int  # the budget fits are judged for
    ram_bytes: int
    context_tokens: int  # the context fits are judged for (its KV cache is part of a budget)
    budget_set: bool = False  # the budget is the one chosen in the settings

    def describe(self) -> str:
        budget = " (the VRAM budget in Settings)" if self.budget_set else ""
        context = f", a context of {self.context_tokens:,} tokens"
        if self.kind == "cuda":
            vram = f"{gib(self.vram_bytes)} of VRAM{budget}" if self.budget_set else f"{gib(self.vram_bytes)} of VRAM free"
            return f"{self.name}: {vram}, {gib(self.ram_bytes)} of RAM{context}"
        return (f"No CUDA GPU: fits are shown for an emulated {gib(self.vram_bytes)} GPU{budget}; "
                f"{gib(self.ram_bytes)} of RAM{context}")


@dataclass(frozen=True)
class Fit:
    kind: str  # "fits", "offloaded", "vram" (too little VRAM) or "ram" (too little RAM)
    label: str
    cached_fraction: float  # of all routed experts, in VRAM


def probe_device(budget_bytes: int | None, context_tokens: int) -> DeviceMemory:
    """The VRAM budget chosen in the settings, else the one the engine would take on the CUDA
    device now (``budget_for_free_memory``: what this process holds there, a loaded model
    included, and most of the free memory; other programs' VRAM is not this app's to use), else
    the emulated GPU's; the RAM; and the context in the settings."""
    import psutil

    import_engine()
    import torch
    from seqmoe.budget import budget_for_free_memory

    ram = psutil.virtual_memory().total
    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        automatic = budget_for_free_memory(torch.cuda.memory_reserved(), free)
        return DeviceMemory("cuda", torch.cuda.get_device_name(), budget_bytes or automatic, ram, context_tokens,
                            budget_bytes is not None)
    return DeviceMemory("emulated", "emulated GPU", budget_bytes or EMULATED_VRAM_BYTES, ram, context_tokens,
                        budget_bytes is not None)


def fit(shape: ModelShape, device: DeviceMemory) -> Fit:
    import_engine()
    from seqmoe.budget import WORKSPACE_BYTES, BudgetTooSmall, CacheGeometry

    # The loader reads every weight into host memory before the experts are split off.
    if shape.total_bytes > device.ram_bytes:
        return Fit("ram", f"too large for this RAM (needs {gib(shape.total_bytes)}, has {gib(device.ram_bytes)})", 0.0)
    geometry = CacheGeometry(
        total_experts=shape.total_experts,
        bytes_per_expert=shape.bytes_per_expert,
        resident_bytes=shape.resident_bytes,
        kv_bytes=shape.kv_bytes(device.context_tokens),
        # An emulated GPU stands for a real one, so it pays a CUDA workspace too.
        workspace_bytes=WORKSPACE_BYTES["cuda"],
        top_k=shape.top_k,
    )
    if geometry.budget_bytes_for(geometry.total_experts) <= device.vram_bytes:
        return Fit("fits", "fits entirely", 1.0)
    try:
        slots = geometry.slots_for_budget(device.vram_bytes)
    except BudgetTooSmall:
        need = geometry.budget_bytes_for(geometry.minimum_slots)
        return Fit("vram", f"too large for this GPU (needs {gib(need)} of VRAM at least)", 0.0)
    fraction = slots / geometry.total_experts
    return Fit("offloaded", f"runs with SeqMoE at {max(math.floor(fraction * 100), 1)}% cached", fraction)


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
