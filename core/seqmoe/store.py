"""Where expert weights live: the host store and the device slot pool.

The host store keeps every routed expert of every MoE layer in host memory (pinned when
copies go to a CUDA device). The slot pool is one set of device tensors shaped
``[slots, ...]`` per expert parameter, shared by all layers: any slot can hold any
layer's expert, and the slot table says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np
import torch
from torch import nn

from .transfer import CopyJob, ExpertKey, JobState

_ALIGNMENT = 16
"""Bytes a grouped matrix product's weights must be aligned to (CUDA's, and the CPU's in older PyTorch)."""


@dataclass(frozen=True)
class ExpertLayout:
    """The per-expert tensors of one experts module: names, per-expert shapes, dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype
    num_experts: int

    @cached_property
    def bytes_per_expert(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return sum(element * _numel(shape) for shape in self.shapes)

    @classmethod
    def of(cls, module: nn.Module) -> "ExpertLayout":
        params = expert_parameters(module)
        first = next(iter(params.values()))
        return cls(
            names=tuple(params),
            shapes=tuple(tuple(p.shape[1:]) for p in params.values()),
            dtype=first.dtype,
            num_experts=first.shape[0],
        )


def expert_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The module's own per-expert parameters (first dimension = number of experts).

    Submodules such as a post-expert norm are shared by all experts and stay resident.
    """
    num_experts = getattr(module, "num_experts", None)
    params = {
        name: param
        for name, param in module.named_parameters(recurse=False)
        if param.dim() >= 2 and (num_experts is None or param.shape[0] == num_experts)
    }
    if not params:
        raise ValueError(f"{type(module).__name__} holds no per-expert parameters")
    return params


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


class HostStore:
    """Every routed expert of every MoE layer, in host memory.

    The modules' expert parameters become the store's tensors layer by layer. A pinned copy
    replaces the loaded weights of its layer at once, so the loaded weights of a layer are
    freed before the next layer is copied: host memory holds the model and one layer's
    experts more at most, not two copies of every expert.
    """

    def __init__(self, modules: list[nn.Module], pin: bool) -> None:
        self.layout = ExpertLayout.of(modules[0])
        self.tensors: list[dict[str, torch.Tensor]] = []
        for module in modules:
            if ExpertLayout.of(module) != self.layout:
                raise ValueError("MoE layers with different expert shapes")
            params = expert_parameters(module)
            layer = {}
            for name in self.layout.names:
                tensor = params[name].data.to("cpu").contiguous()
                layer[name] = params[name].data = tensor.pin_memory() if pin else tensor
            self.tensors.append(layer)

    @property
    def num_layers(self) -> int:
        return len(self.tensors)

    @property
    def total_experts(self) -> int:
        return self.num_layers * self.layout.num_experts

    def sources(self, key: ExpertKey) -> list[torch.Tensor]:
        layer, expert = key
        return [self.tensors[layer][name][expert] for name in self.layout.names]


class SlotState(Enum):
    EMPTY = "empty"
    LOADING = "loading"
    READY = "ready"


class SlotPool:
    """Device tensors with room for ``size`` experts, and the table of what each slot holds."""

    def __init__(self, layout: ExpertLayout, size: int, device: torch.device) -> None:
        self.layout = layout
        self.size = size
        self.device = device
        self.tensors = {
            name: torch.empty((size, *shape), dtype=layout.dtype, device=device)
            for name, shape in zip(layout.names, layout.shapes)
        }
        self.owner: list[ExpertKey | None] = [None] * size
        self.job: list[CopyJob | None] = [None] * size
        self.pins = np.zeros(size, dtype=np.int64)
        self.held = np.full(size, -1, dtype=np.int64)
        """The expert each slot holds, as ``layer * num_experts + expert`` (the policies'
        ``flat_indices``; -1: empty)."""
        self.slot_of: dict[ExpertKey, int] = {}
        self.free: set[int] = set(range(size))
        itemsize = layout.dtype.itemsize
        self._slot_step = max(_ALIGNMENT // math.gcd(_ALIGNMENT, _numel(shape) * itemsize) for shape in layout.shapes)
        """Slots between two whose tensors all start on an ``_ALIGNMENT``-byte boundary."""

    def span(self, slots: Sequence[int]) -> tuple[dict[str, torch.Tensor], int]:
        """The pool's tensors from about the lowest of ``slots`` to the highest, and the slot they start at.

        Grouped matrix products visit every expert group of their weights, empty or not (on the
        CPU about a microsecond each), so a decode step's few experts need not pay for the whole
        pool. The start is rounded down to a slot whose tensors are aligned as the kernels require.
        """
        first = min(slots) // self._slot_step * self._slot_step
        end = max(slots) + 1
        return {name: tensor[first:end] for name, tensor in self.tensors.items()}, first

    def state(self, slot: int) -> SlotState:
        if self.owner[slot] is None:
            return SlotState.EMPTY
        job = self.job[slot]
        if job is not None and job.state in (JobState.QUEUED, JobState.COPYING):
            return SlotState.LOADING
        return SlotState.READY

    def destinations(self, slot: int) -> list[torch.Tensor]:
        return [self.tensors[name][slot] for name in self.layout.names]

    def free_slot(self) -> int | None:
        return min(self.free) if self.free else None

    def assign(self, slot: int, key: ExpertKey, job: CopyJob | None) -> None:
        self.clear(slot)
        self.owner[slot] = key
        self.job[slot] = job
        self.slot_of[key] = slot
        self.held[slot] = key[0] * self.layout.num_experts + key[1]
        self.free.discard(slot)

    def clear(self, slot: int) -> None:
        previous = self.owner[slot]
        if previous is not None:
            del self.slot_of[previous]
        self.owner[slot] = None
        self.job[slot] = None
        self.held[slot] = -1
        self.free.add(slot)
