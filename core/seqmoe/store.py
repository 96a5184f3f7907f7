"""Where expert weights live: the host store and the device slot pool.

The host store keeps every routed expert of every MoE layer in host memory (pinned when
copies go to a CUDA device). The slot pool is one set of device tensors shaped
``[slots, ...]`` per expert parameter, shared by all layers: any slot can hold any
layer's expert, and the slot table says which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np
import torch
from torch import nn

from .compression import UNPACK_WORKSPACE, WORTH_PACKING, PackedExpert, RawExpert, pack, packable, packed_size
from .pinned import PinnedBuffers
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
    """Every routed expert of every MoE layer, in host memory, packed when its dtype packs.

    bfloat16 experts are kept packed (``compression``): about three quarters of their bytes,
    in host memory and over the link, every bit given back when a copy unpacks into its slot.
    Other dtypes, and a layer that does not pack to ``WORTH_PACKING`` of its bytes (weights
    spread over many exponents, or many exact zeros: each kept whole costs 6 bytes), are kept
    as they are, and the modules' expert parameters then become the store's tensors. A
    layer's packed (or pinned) copy replaces its loaded weights at once, so host memory holds
    the model and one layer's experts more at most, not two copies of every expert. Packed,
    the modules' expert parameters keep their shapes over no memory: only the store's copies
    are ever computed with.
    """

    def __init__(self, modules: list[nn.Module], pinned: PinnedBuffers | None, on_layer: Callable[[int], None] | None = None) -> None:
        """``pinned``: where to keep the experts page-locked (for copies to a CUDA device), if
        anywhere; ``on_layer`` is told how many layers are kept after each (it may raise to stop)."""
        self.layout = ExpertLayout.of(modules[0])
        self._pinned = pinned  # the store's buffers stay page-locked as long as the store lives
        self.packed = False
        """Whether any layer is kept packed."""
        self._experts: list[list[PackedExpert | RawExpert]] = []
        for module in modules:
            if ExpertLayout.of(module) != self.layout:
                raise ValueError("MoE layers with different expert shapes")
            params = [expert_parameters(module)[name] for name in self.layout.names]
            layer = self._pack_layer([param.data for param in params], pinned) if packable(self.layout.dtype) else None
            if layer is not None:
                self.packed = True
                for param in params:
                    param.data = torch.zeros((), dtype=param.dtype).expand(param.shape)
            else:
                for param in params:
                    param.data = pinned.copy(param.data) if pinned is not None else param.data.to("cpu").contiguous()
                layer = [RawExpert(tuple(param.data[expert] for param in params)) for expert in range(self.layout.num_experts)]
            self._experts.append(layer)
            if on_layer is not None:
                on_layer(len(self._experts))
        self.bytes_per_copy = sum(e.nbytes for layer in self._experts for e in layer) / self.total_experts
        """Bytes one expert's copy moves over the link, on average (its slot takes ``layout.bytes_per_expert``)."""

    def _pack_layer(self, tensors: list[torch.Tensor], pinned: PinnedBuffers | None) -> list[PackedExpert] | None:
        """The layer's experts packed into one (pinned) buffer, a row each, and one for the weights
        they keep whole; ``None`` if they pack to more than ``WORTH_PACKING`` of their bytes.
        Packed straight into the rows: a buffer per expert, freed once copied, left host memory
        fragmented (0.4 GiB of a 1.5 GiB model held after loading)."""
        experts = self.layout.num_experts
        row = packed_size([_numel(shape) for shape in self.layout.shapes])
        rows = (pinned.empty(experts * row) if pinned is not None else torch.empty(experts * row, dtype=torch.uint8)).view(experts, row)
        packed = [pack([tensor[expert] for tensor in tensors], rows[expert]) for expert in range(experts)]
        if sum(e.nbytes for e in packed) > WORTH_PACKING * self.layout.bytes_per_expert * experts:
            if pinned is not None:  # the layer is kept as it is, locked anew: these rows would stay locked unused
                pinned.release(rows)
            return None
        blob = torch.cat([expert.escapes for expert in packed])
        blob = pinned.copy(blob) if pinned is not None else blob
        ends = np.cumsum([expert.escapes.numel() for expert in packed]).tolist()
        return [
            PackedExpert(expert.data, blob[end - expert.escapes.numel() : end], expert.segments)
            for expert, end in zip(packed, ends)
        ]

    @property
    def num_layers(self) -> int:
        return len(self._experts)

    @property
    def total_experts(self) -> int:
        return self.num_layers * self.layout.num_experts

    @property
    def packed_share(self) -> float:
        """The share of an expert's bytes its copy moves (below 1 when experts are packed)."""
        return self.bytes_per_copy / self.layout.bytes_per_expert

    @property
    def unpack_bytes(self) -> int:
        """Device memory a copy's unpacking needs beside the slots (none when nothing is packed)."""
        return math.ceil(UNPACK_WORKSPACE * self.layout.bytes_per_expert) if self.packed else 0

    def layer_on(self, layer: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Every expert of ``layer``, unpacked on ``device``: ``[experts, ...]`` per expert tensor."""
        tensors = {
            name: torch.empty((self.layout.num_experts, *shape), dtype=self.layout.dtype, device=device)
            for name, shape in zip(self.layout.names, self.layout.shapes)
        }
        for expert, source in enumerate(self._experts[layer]):
            source.write_into([tensor[expert] for tensor in tensors.values()])
        return tensors

    def expert(self, key: ExpertKey) -> PackedExpert | RawExpert:
        """What a copy of ``key`` moves: ``write_into`` the slot's tensors gives its weights."""
        layer, expert = key
        return self._experts[layer][expert]


def aligned_step(tensors: dict[str, torch.Tensor]) -> int:
    """Experts between two whose tensors (``[experts, ...]`` each) all start on an
    ``_ALIGNMENT``-byte boundary."""
    return max(
        _ALIGNMENT // math.gcd(_ALIGNMENT, tensor[0].numel() * tensor.element_size()) for tensor in tensors.values()
    )


def grouped_view(tensors: dict[str, torch.Tensor], experts: Sequence[int], step: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """``tensors`` (``[experts, ...]`` each) seen as few expert groups as hold ``experts`` (distinct),
    and the group each of ``experts`` is in; ``step``: ``aligned_step(tensors)``.

    Grouped matrix products visit every expert group of their weights, empty or not (on the CPU
    about a microsecond each), so a decode step's few experts need not pay for all. On the CPU,
    experts evenly spaced and starting aligned are seen through strides as one group each: one or
    two always are (a decode step of a top-2 model) where an expert's tensors take a multiple of
    16 bytes. Timed alone on this project's 2-core CPU (one thread, the median of 3,000 random
    pairs, three rounds), the experts of a demo decode layer took 141-148 µs instead of 172-174 µs
    among the 58 slots of cache ratio 0.45 (their span before), and 141-142 µs instead of
    152-155 µs among a resident layer's 16, whose grouped products visited all 16. Others, and all
    on CUDA (whose grouped kernel was not tried with such strides: no GPU here; its decode steps
    gather their experts anyway, ``DECODE_IMPLEMENTATIONS``), are seen as the span from about the
    lowest to the highest. Each group starts where the tensors are aligned as the kernels require.
    """
    ordered = sorted(experts)
    first, spacing = ordered[0], ordered[1] - ordered[0] if len(ordered) > 1 else step
    on_cpu = next(iter(tensors.values())).device.type == "cpu"
    if on_cpu and first % step == 0 and spacing % step == 0 and all(
        later - earlier == spacing for earlier, later in zip(ordered, ordered[1:])
    ):
        view = {
            name: tensor.as_strided(
                (len(ordered), *tensor.shape[1:]),
                (tensor.stride(0) * spacing, *tensor.stride()[1:]),
                tensor.storage_offset() + first * tensor.stride(0),
            )
            for name, tensor in tensors.items()
        }
        return view, [(expert - first) // spacing for expert in experts]
    first = first // step * step
    end = ordered[-1] + 1
    return {name: tensor[first:end] for name, tensor in tensors.items()}, [expert - first for expert in experts]


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
        self._slot_step = aligned_step(self.tensors)

    def view(self, slots: Sequence[int]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """The pool's tensors seen as few expert groups as hold ``slots`` (see ``grouped_view``)."""
        return grouped_view(self.tensors, slots, self._slot_step)

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
