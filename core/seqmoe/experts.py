"""The ``seqmoe`` experts implementation registered in transformers' ``ExpertsInterface``.

transformers calls ``fn(module, hidden_states, top_k_index, top_k_weights)`` for every
MoE layer after the model's own router has chosen the experts. We do not reimplement the
expert math: we hand the model's own implementation (``grouped_mm``, ``batched_mm`` or the
class's eager forward) a *slot view* of the module, whose expert tensors are the device
slot pool and whose expert ids are slot ids. Every layout flag, gate function, bias and
post-expert norm of the module therefore applies unchanged, and each expert's rows go
through the same kernel as in the unoffloaded model.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from .cache import ExpertCache
from .events import ExpertsForecast
from .policies import Forecast
from .store import aligned_step, grouped_view
from .threads import one_cpu_thread

IMPLEMENTATION = "seqmoe"
_RUNTIME_ATTR = "_seqmoe_runtime"

ExpertsFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
DECODE_IMPLEMENTATIONS = {"grouped_mm": "batched_mm"}
"""What transformers' ``generate`` decodes with in place of an implementation off the CPU
(``GenerationMixin._optimize_model_for_decode``: faster on one token a step)."""
SMALL_EXPERT_BYTES = 2**20
"""Below this size of one expert's weights, a CPU decode step is a series of operations of
microseconds each, shorter than waking the sleeping threads of the intra-op pool, and runs on
one thread (``threads.one_cpu_thread``). On two cores the demo model (110 KB experts) decoded
1.75 times as fast so; an OLMoE-shaped model (12.6 MB) 10% slower on average, so larger
experts keep every thread."""


class SlotView:
    """The experts module as seen through the slot pool: same behaviour, other weights, as many
    experts as ``tensors`` hold slots."""

    def __init__(self, module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        self._module = module
        self.__dict__.update(tensors)
        self.num_experts = next(iter(tensors.values())).shape[0]

    def __getattr__(self, name: str) -> object:
        return getattr(self._module, name)


def base_implementation(module: nn.Module, name: str) -> ExpertsFn:
    """The function the unoffloaded model would use for this module."""
    if name == "eager":
        return type(module).forward.__wrapped__
    return ALL_EXPERTS_FUNCTIONS[name]


class ResidentLayer:
    """All experts of the layer on the device (the ``full`` policy): no copies, and no sync on a GPU."""

    def __init__(self, tensors: dict[str, torch.Tensor], base: ExpertsFn, accesses: torch.Tensor) -> None:
        """``accesses``: ``[prefill, decode]`` counts of the experts the layers use, kept on the device."""
        self.tensors = tensors
        self.base = base
        self._by_phase = accesses.unbind()  # views made once, not an indexing op per layer and token
        self._step = aligned_step(tensors)
        self.decoding = False
        """Set by ``decode_phase``."""
        self.should_stop: Callable[[], bool] | None = None
        """Set by ``stoppable_prefill``."""

    def forward(self, module: nn.Module, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        counts = self._by_phase[self.decoding]
        if index.device.type != "cpu":  # counted on the device: no sync for a gain only the CPU's grouped product has
            used = torch.zeros(next(iter(self.tensors.values())).shape[0], dtype=torch.int64, device=index.device)
            counts.add_(used.index_fill_(0, index.reshape(-1), 1).sum())
            return self.base(SlotView(module, self.tensors), hidden, index, weights)
        # The experts used, as few groups as the offloaded layers see theirs: the reference pays
        # for no group it does not use either.
        needed = torch.unique(index).tolist()
        counts.add_(len(needed))
        tensors, groups = grouped_view(self.tensors, needed, self._step)
        return self.base(SlotView(module, tensors), hidden, _slot_lookup(needed, groups, index)[index], weights)


class OffloadedLayer:
    """Experts served from the shared slot pool through the expert cache.

    Between routing and computing, the policy's forecast for the next layers is turned
    into prefetches (decode) or the next layer's experts are streamed in (prefill), so the
    copies overlap this layer's compute. The forecast runs once the layer's own misses are on
    their way and before the layer waits for them: on the CPU's emulated link that wait blocks
    the host, and on CUDA the predictor's kernels then run ahead of the compute stream's wait
    for the copies instead of behind it. Where the plan of copies runs depends on the link
    (``Copier.blocks_host``): on the emulated link inside the same wait, so that the copies are
    queued before the layer computes; on CUDA, where nothing blocks the host, after the layer's
    kernels are launched, so that the host plans while the GPU computes.
    """

    def __init__(self, layer: int, num_layers: int, cache: ExpertCache, base: ExpertsFn) -> None:
        self.layer = layer
        self.num_layers = num_layers
        self.cache = cache
        self.base = base
        self.decoding = False
        """Set by ``decode_phase``: a prompt of one token is prefill all the same."""
        self.should_stop: Callable[[], bool] | None = None
        """Set by ``stoppable_prefill``."""

    def _forecast(self, hidden: torch.Tensor, index: torch.Tensor, prefill: bool) -> Callable[[], None]:
        """Forecast from this layer's routing; returns the plan of copies it leads to, to run next."""
        policy = self.cache.policy
        if prefill:
            policy.look_past_prompt(self.layer, hidden[-1], index[-1])
            if policy.streams_prefill and self.layer + 1 < self.num_layers:
                return partial(self.cache.stream, self.layer + 1, policy.stream_order(self.layer + 1))
            return _nothing
        forecasts = policy.forecast(self.layer, hidden[-1], index[-1])
        return partial(self._plan, forecasts) if forecasts else _nothing

    def _plan(self, forecasts: Sequence[Forecast]) -> None:
        self.cache.plan(forecasts)
        events = self.cache.events
        if events.active:
            events.emit(ExpertsForecast(self.layer, tuple((f.key, f.probability) for f in forecasts)))

    def forward(self, module: nn.Module, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # One device-to-host sync per layer: the router's choice decides what to copy.
        needed = torch.unique(index).tolist()
        prefill = not self.decoding
        if len(needed) <= self.cache.size:
            plans: list[Callable[[], None]] = []

            def look_ahead() -> None:
                plan = self._forecast(hidden, index, prefill)
                if self.cache.copier.blocks_host:
                    plan()
                else:
                    plans.append(plan)

            slots = self.cache.acquire(self.layer, needed, prefill, look_ahead)
            try:
                tensors, groups = self.cache.pool.view(slots)
                lookup = _slot_lookup(needed, groups, index)
                out = self.base(SlotView(module, tensors), hidden, lookup[index], weights)
                for plan in plans:
                    plan()
                return out
            finally:
                self.cache.release(slots)
        view = SlotView(module, self.cache.pool.tensors)
        return self._forward_in_groups(view, hidden, index, weights, needed, prefill)

    def _forward_in_groups(
        self,
        view: SlotView,
        hidden: torch.Tensor,
        index: torch.Tensor,
        weights: torch.Tensor,
        needed: list[int],
        prefill: bool,
    ) -> torch.Tensor:
        """A layer that needs more experts than the cache holds (a long prefill on a small cache).

        Experts are processed in groups that fit. Each (token, k) pair is computed alone
        with weight 1, all rows of one expert in the same call as in the reference; the
        routing weights are then applied and summed exactly as ``grouped_mm`` and
        ``batched_mm`` do, so the result matches them bit for bit.
        """
        num_tokens, top_k = index.shape
        flat = index.reshape(-1)
        pair_out = torch.empty((flat.numel(), hidden.shape[-1]), dtype=hidden.dtype, device=hidden.device)
        ones = torch.ones((1, 1), dtype=weights.dtype, device=weights.device)
        for start in range(0, len(needed), self.cache.size):
            group = needed[start : start + self.cache.size]
            slots = self.cache.acquire(self.layer, group, prefill)
            try:
                lookup = _slot_lookup(group, slots, index)
                rows = torch.isin(flat, _index_tensor(group, lookup.device)).nonzero().squeeze(1)
                pair_index = lookup[flat[rows]].unsqueeze(1)
                pair_out[rows] = self.base(view, hidden[rows // top_k], pair_index, ones.expand(rows.numel(), 1))
            finally:
                self.cache.release(slots)
        weighted = pair_out.view(num_tokens, top_k, -1) * weights.unsqueeze(-1)
        return weighted.sum(dim=1).to(hidden.dtype)


def _nothing() -> None:
    pass


def _slot_lookup(experts: list[int], slots: list[int], like: torch.Tensor) -> torch.Tensor:
    """A table from expert id to slot id, on the device of ``like``. Built as a list and made a
    tensor in one operation: it is made at every layer, and each tensor operation costs more host
    time than the few dozen entries of the list."""
    lookup = [0] * (max(experts) + 1)
    for expert, slot in zip(experts, slots):
        lookup[expert] = slot
    return _index_tensor(lookup, like.device)


def _index_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as a long tensor on ``device``. For a GPU it is made in page-locked memory: a
    non-blocking copy from ordinary memory may make the host wait for the compute stream, which
    has just been told to wait for the layer's copies, before the layer's kernels are launched."""
    return torch.tensor(values, dtype=torch.long, pin_memory=device.type == "cuda").to(device, non_blocking=True)


def follow_decode_switch(model: nn.Module, experts: Sequence[nn.Module], name: str, expert_bytes: int) -> None:
    """Make ``model``'s ``generate`` switch the base implementation ``name`` of its experts for the
    decode steps as it switches an unoffloaded model's, so that each expert's rows still go through
    the kernel they go through there. transformers sees the ``seqmoe`` implementation, which it
    leaves alone, so its own switch is replaced on this model by one that follows the base.

    On the CPU, where transformers keeps the kernel, the decode steps of a model with small
    experts (``expert_bytes`` each, below ``SMALL_EXPERT_BYTES``) run on one thread; prefill keeps every thread. Every policy,
    ``full`` included, decodes so. The switch is also where the offloaded layers learn that
    prefill is over (``decode_phase``)."""
    decode = DECODE_IMPLEMENTATIONS.get(name)
    one_thread = expert_bytes < SMALL_EXPERT_BYTES
    # The model holds the switch: a strong reference back would make the model a cycle that only
    # the garbage collector frees, so a closed engine's weights would outlive it.
    model_ref = weakref.ref(model)

    @contextmanager
    def switched() -> Iterator[None]:
        device = model_ref().device
        if device.type == "cpu":  # transformers' own condition for keeping the kernel
            with one_cpu_thread(device) if one_thread else nullcontext(), decode_phase(experts):
                yield
            return
        _set_base(experts, decode or name)
        try:
            with decode_phase(experts):
                yield
        finally:
            _set_base(experts, name)

    model._optimize_model_for_decode = switched


@contextmanager
def decode_phase(experts: Sequence[nn.Module]) -> Iterator[None]:
    """The forward passes in the block are decode steps, each after the last: the offloaded
    layers of ``experts`` count, forecast and copy for decode. Outside it they are prefill,
    whatever their number of tokens; the resident layers of ``full`` count so too."""
    with _runtimes_set(experts, "decoding", True, False):
        yield


class StoppedInPrefill(Exception):
    """A stop asked for while the prompt was being read: raised between two MoE layers."""


@contextmanager
def stoppable_prefill(experts: Sequence[nn.Module], should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Check ``should_stop`` before each MoE layer of prefill (``seqmoe_experts_forward``), and raise
    ``StoppedInPrefill`` once it says so. Generation checks it only after each token, and an
    offloaded long prompt, which streams every layer's experts, can take minutes before its first
    token."""
    with _runtimes_set(experts, "should_stop", should_stop, None):
        yield


@contextmanager
def _runtimes_set(experts: Sequence[nn.Module], name: str, value: object, after: object) -> Iterator[None]:
    """``name`` set to ``value`` on the runtimes serving ``experts`` for the block, then to ``after``."""
    runtimes = [module.__dict__.get(_RUNTIME_ATTR) for module in experts]
    served = [runtime for runtime in runtimes if isinstance(runtime, (OffloadedLayer, ResidentLayer))]
    for runtime in served:
        setattr(runtime, name, value)
    try:
        yield
    finally:
        for runtime in served:
            setattr(runtime, name, after)


def _set_base(experts: Sequence[nn.Module], name: str) -> None:
    for module in experts:
        runtime = module.__dict__.get(_RUNTIME_ATTR)
        if runtime is not None:
            runtime.base = base_implementation(module, name)


def seqmoe_experts_forward(
    module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    runtime = module.__dict__.get(_RUNTIME_ATTR)
    if runtime is None:
        raise RuntimeError(f"{type(module).__name__} was not prepared by the seqmoe engine")
    if not runtime.decoding and runtime.should_stop is not None and runtime.should_stop():
        raise StoppedInPrefill
    return runtime.forward(module, hidden_states, top_k_index, top_k_weights)


def attach(module: nn.Module, runtime: ResidentLayer | OffloadedLayer | None) -> None:
    """Give an experts module the runtime that serves its weights (plain attribute, not a submodule)."""
    module.__dict__[_RUNTIME_ATTR] = runtime


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, seqmoe_experts_forward)
