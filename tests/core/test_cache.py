"""Slot pool rules: pinned experts are never evicted; LRU order; budget arithmetic."""

from __future__ import annotations

import gc
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from seqmoe import Engine
from seqmoe.budget import FREE_MEMORY_MARGIN, CacheGeometry
from seqmoe.cache import ExpertCache
from seqmoe.compression import RawExpert
from seqmoe.errors import BudgetTooSmall
from seqmoe.events import EventBus, ExpertEvicted, LayerRouted
from seqmoe.pinned import PAGE, PinnedBuffers
from seqmoe.policies import BeladyPolicy, LRUPolicy
from seqmoe.simulate import SimulatedCopier, VirtualClock
from seqmoe.store import ExpertLayout, HostStore, SlotPool
from seqmoe.transfer import EmulatedCopier


class FakeExperts(nn.Module):
    def __init__(self, layer: int, experts: int = 4, shape: tuple[int, int] = (4, 2)) -> None:
        super().__init__()
        self.num_experts = experts
        values = torch.arange(experts, dtype=torch.float32).view(experts, 1, 1) + 100 * layer
        self.gate_up_proj = nn.Parameter(values.expand(experts, *shape).clone())
        self.down_proj = nn.Parameter(values.expand(experts, shape[1], shape[1]).clone())


@pytest.fixture
def cache() -> ExpertCache:
    host = HostStore([FakeExperts(layer) for layer in range(3)], pinned=None)
    copier = EmulatedCopier(gbytes_per_s=100.0, latency_s=0.0)
    yield ExpertCache(host, size=3, device=torch.device("cpu"), copier=copier, policy=LRUPolicy(3, 4), events=EventBus())
    copier.close()


class Registry:
    """The driver's registry of page-locked memory, as ranges (address, bytes): pinning needs
    CUDA, so the store's registrations are checked here instead."""

    def __init__(self, on_register: Callable[[], None] = lambda: None) -> None:
        self.ranges: dict[int, int] = {}
        self._on_register = on_register

    def register(self, address: int, nbytes: int) -> None:
        assert address % PAGE == 0 and nbytes % PAGE == 0  # whole pages, none shared with another range
        assert all(address + nbytes <= start or start + size <= address for start, size in self.ranges.items())
        self._on_register()
        self.ranges[address] = nbytes

    def unregister(self, address: int) -> None:
        del self.ranges[address]

    def holds(self, tensor: torch.Tensor) -> bool:
        first, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        return any(start <= first and end <= start + size for start, size in self.ranges.items())


def test_pinned_copies_replace_each_layers_loaded_weights_before_the_next_layer_is_copied() -> None:
    """Else host memory holds a pinned copy of every expert beside the loaded model while the
    store is built."""
    modules = [FakeExperts(layer) for layer in range(3)]
    earlier_adopted: list[bool] = []
    registry = Registry(lambda: earlier_adopted.append(
        all(registry.holds(p.data) for module in modules[: len(registry.ranges) // 2] for p in module.parameters())))
    host = HostStore(modules, PinnedBuffers(registry))
    assert len(registry.ranges) == 6 and all(earlier_adopted)
    for index, module in enumerate(modules):
        gate_up, down = host.expert((index, 0)).tensors
        assert (module.gate_up_proj.data_ptr(), module.down_proj.data_ptr()) == (gate_up.data_ptr(), down.data_ptr())
        assert registry.holds(module.gate_up_proj.data) and registry.holds(module.down_proj.data)
    assert host.expert((2, 3)).tensors[0][0, 0].item() == 203.0


def test_bfloat16_experts_are_kept_packed_page_locked_as_they_are_and_given_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    modules = [FakeExperts(layer, experts=5, shape=(640, 48)) for layer in range(3)]
    for module in modules:
        for param in module.parameters():
            param.data = (torch.randn(param.shape) * 0.02).to(torch.bfloat16)
    weights = [{name: param.data.clone() for name, param in module.named_parameters()} for module in modules]
    registry = Registry()
    host = HostStore(modules, PinnedBuffers(registry))
    assert host.packed and len(registry.ranges) == 6  # two buffers a layer: the rows, and the weights kept whole
    assert 0.74 < host.bytes_per_copy / host.layout.bytes_per_expert < 0.78  # 12 bits a weight, and a few kept whole
    experts = [host.expert((layer, expert)) for layer in range(3) for expert in range(5)]
    assert all(registry.holds(tensor) for expert in experts for tensor in (expert.data, expert.escapes) if tensor.numel())
    # Locked as they are, in whole pages; PyTorch's pinned allocator rounds each buffer up to a
    # power of two, which can take twice the memory.
    kept = sum(expert.nbytes for expert in experts)
    assert sum(registry.ranges.values()) < kept + 6 * PAGE
    for module, kept in zip(modules, weights):
        # The loaded weights are gone: the parameters keep their shape over no memory.
        assert all(param.shape == kept[name].shape and param.stride()[0] == 0 for name, param in module.named_parameters())
    for layer in range(3):
        unpacked = host.layer_on(layer, torch.device("cpu"))
        assert all(torch.equal(unpacked[name].view(torch.int16), weights[layer][name].view(torch.int16)) for name in unpacked)
    del host, experts
    gc.collect()
    assert registry.ranges == {}  # unlocked with the store, before its memory is freed


def test_bfloat16_experts_that_do_not_pack_are_locked_once_as_they_are() -> None:
    """Their packed rows, made and found no smaller, must not stay locked beside them."""
    modules = [FakeExperts(layer, experts=5, shape=(640, 48)) for layer in range(2)]
    for module in modules:
        for param in module.parameters():  # random bit patterns: no crowded exponents
            param.data = torch.randint(-(2**15), 2**15, param.shape, dtype=torch.int16).view(torch.bfloat16)
    raw = sum(param.numel() * 2 for module in modules for param in module.parameters())
    registry = Registry()
    host = HostStore(modules, PinnedBuffers(registry))
    assert not host.packed and len(registry.ranges) == 4  # each layer's two tensors
    assert sum(registry.ranges.values()) < raw + 4 * PAGE


def test_acquired_slots_hold_the_right_weights(cache: ExpertCache) -> None:
    slots = cache.acquire(2, [1, 3], prefill=False)
    assert [cache.pool.tensors["gate_up_proj"][s][0, 0].item() for s in slots] == [201.0, 203.0]
    cache.release(slots)


# A slot of 3 x 4 bytes in float32 starts 16-byte aligned every 4th slot; of 3 x 2 bytes in bfloat16, every 8th.
@pytest.mark.parametrize("dtype, step", [(torch.float32, 4), (torch.bfloat16, 8)])
def test_a_decode_step_computes_on_the_slots_it_uses_as_few_groups_from_aligned_starts(dtype: torch.dtype, step: int) -> None:
    """Its expert kernel sees only the slots it uses where strides can show them so, else the slots
    from the lowest it uses to the highest, not the whole pool (the CPU's grouped product pays for
    every group), each group 16-byte aligned."""
    layout = ExpertLayout(names=("w",), shapes=((3,),), dtype=dtype, num_experts=4)
    pool = SlotPool(layout, 64, torch.device("cpu"))
    pool.tensors["w"].copy_(torch.arange(64, dtype=dtype).unsqueeze(1).expand(64, 3))

    def seen(slots: list[int]) -> tuple[int, list[float]]:
        tensors, groups = pool.view(slots)
        w = tensors["w"]
        assert w.data_ptr() % 16 == 0
        return w.shape[0], [w[group, 0].item() for group in groups]

    aligned = [2 * step, 6 * step, 4 * step]  # evenly spaced, given in any order
    assert seen(aligned) == (3, [float(slot) for slot in aligned])
    assert pool.view(aligned)[0]["w"].stride(0) * layout.dtype.itemsize % 16 == 0  # every group aligned too
    assert seen([5 * step]) == (1, [5.0 * step])
    assert seen([13, 21]) == (22 - 13 // step * step, [13.0, 21.0])  # 13 is no aligned start: the span
    assert seen([0, step, 3 * step]) == (3 * step + 1, [0.0, float(step), 3.0 * step])  # not evenly spaced


def test_lru_evicts_the_least_recently_used(cache: ExpertCache) -> None:
    for layer, expert in [(0, 0), (0, 1), (0, 2), (0, 0)]:
        cache.release(cache.acquire(layer, [expert], prefill=False))
    evicted = []
    cache.events.subscribe(lambda e: evicted.append(e.key) if isinstance(e, ExpertEvicted) else None)
    cache.release(cache.acquire(1, [0], prefill=False))
    assert evicted == [(0, 1)]
    assert (cache.hits, cache.misses) == (1, 4)


def test_experts_of_the_running_layer_are_never_evicted(cache: ExpertCache) -> None:
    running = cache.acquire(0, [0, 1], prefill=False)
    other = cache.acquire(1, [2], prefill=False)
    cache.release(other)
    # Only one slot is unpinned: loading two more experts must not touch layer 0's slots.
    cache.release(cache.acquire(2, [3], prefill=False))
    cache.release(cache.acquire(2, [0], prefill=False))
    assert {cache.pool.owner[s] for s in running} == {(0, 0), (0, 1)}
    with pytest.raises(RuntimeError, match="pinned"):
        cache.acquire(1, [1, 3], prefill=False)
    cache.release(running)


def test_a_failed_look_ahead_leaves_no_slot_pinned(cache: ExpertCache) -> None:
    """Else every failed layer would shrink the cache for good, until no layer could load."""

    def fail() -> None:
        raise RuntimeError("predictor failed")

    cache.release(cache.acquire(0, [0], prefill=False))
    for _ in range(cache.size + 1):
        with pytest.raises(RuntimeError, match="predictor failed"):
            cache.acquire(1, [0, 1], prefill=False, meanwhile=fail)
    assert not any(cache.pool.pins)
    slots = cache.acquire(2, [0, 1, 2], prefill=False)
    assert [cache.pool.tensors["gate_up_proj"][s][0, 0].item() for s in slots] == [200.0, 201.0, 202.0]
    cache.release(slots)


def failing_writes(monkeypatch: pytest.MonkeyPatch, host: HostStore, key: tuple[int, int], times: int) -> None:
    """The copies of ``key`` fail to write ``times`` times (out of device memory to unpack, say)."""
    real, failed = RawExpert.write_into, []

    def write_into(expert: RawExpert, destinations: list[torch.Tensor], non_blocking: bool = False) -> None:
        if expert is host.expert(key) and len(failed) < times:
            failed.append(key)
            raise RuntimeError("out of memory (injected)")
        real(expert, destinations, non_blocking)

    monkeypatch.setattr(RawExpert, "write_into", write_into)


def weights(cache: ExpertCache, slots: list[int]) -> list[float]:
    return [cache.pool.tensors["down_proj"][slot][0, 0].item() for slot in slots]


def test_a_warm_up_that_fails_leaves_no_copy_to_overwrite_a_later_one(monkeypatch: pytest.MonkeyPatch) -> None:
    host = HostStore([FakeExperts(0, 5)], pinned=None)
    clock = VirtualClock()
    prior = torch.tensor([[0.9, 0.8, 0.7, 0.1, 0.1]])  # warm-up copies experts 0, 1, 2, each taking a second
    cache = ExpertCache(host, 3, torch.device("cpu"), SimulatedCopier(clock, 1.0, 1), BeladyPolicy(1, prior), EventBus(), clock=clock)
    failing_writes(monkeypatch, host, (0, 0), times=1)
    with pytest.raises(RuntimeError, match="injected"):
        cache.warm()
    cache.end_of_generation()
    cache.release(cache.acquire(0, [3], prefill=False))
    clock.now += 10.0  # every copy has landed
    slots = cache.acquire(0, [3, 4], prefill=False)
    assert weights(cache, slots) == [3.0, 4.0]
    cache.release(slots)


def test_a_layer_that_fails_to_copy_counts_no_cancelled_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    host = HostStore([FakeExperts(0, 4)], pinned=None)
    clock = VirtualClock()
    cache = ExpertCache(host, 3, torch.device("cpu"), SimulatedCopier(clock, 1.0, 1), LRUPolicy(1, 4), EventBus(), clock=clock)
    failing_writes(monkeypatch, host, (0, 0), times=2)
    with pytest.raises(RuntimeError, match="injected"):
        cache.acquire(0, [0, 1, 2], prefill=False)
    cache.end_of_generation()  # as the engine does after a failed generation: the queued copies go
    assert (cache.prefetches.issued, cache.prefetches.cancelled) == (0, 0)
    assert not any(cache.pool.pins)


def test_a_layer_that_fails_while_pinning_its_experts_leaves_none_pinned(
    cache: ExpertCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.release(cache.acquire(0, [0, 1], prefill=False))
    real = ExpertCache._pin_resident

    def pin(self: ExpertCache, key: tuple[int, int]) -> int | None:
        if key == (0, 1):
            raise RuntimeError("a copy's earlier failure, raised as it is cancelled")
        return real(self, key)

    monkeypatch.setattr(ExpertCache, "_pin_resident", pin)
    with pytest.raises(RuntimeError, match="earlier failure"):
        cache.acquire(0, [0, 1], prefill=False)
    assert not any(cache.pool.pins)


def test_an_expert_named_twice_in_one_layer_is_refused(cache: ExpertCache) -> None:
    with pytest.raises(ValueError, match="twice"):
        cache.acquire(0, [1, 1], prefill=False)
    assert not any(cache.pool.pins) and cache.pool.owner == [None, None, None]


def test_routed_events_report_misses(cache: ExpertCache) -> None:
    seen = []
    cache.events.subscribe(seen.append)
    cache.release(cache.acquire(0, [0, 1], prefill=True))
    cache.release(cache.acquire(0, [1, 2], prefill=False))
    routed = [e for e in seen if isinstance(e, LayerRouted)]
    assert [(e.experts, e.missed, e.prefill) for e in routed] == [((0, 1), (0, 1), True), ((1, 2), (2,), False)]


def geometry(**overrides: int) -> CacheGeometry:
    values = dict(total_experts=100, bytes_per_expert=2**20, resident_bytes=10 * 2**20, kv_bytes=5 * 2**20,
                  workspace_bytes=2**20, top_k=2)
    values.update(overrides)
    return CacheGeometry(**values)


def test_budget_pays_for_resident_weights_kv_and_workspace_first() -> None:
    assert geometry().slots_for_budget(16 * 2**20 + 40 * 2**20) == 40
    assert geometry().slots_for_budget(2**40) == 100
    assert geometry().slots_for_ratio(0.45) == 45


def test_budget_below_minimum_names_the_minimum() -> None:
    # 16 MiB of weights, KV cache and workspace, then three 1 MiB experts: 19 MiB, 0.0186 GiB;
    # 18 MiB are 0.0176 GiB: with two decimals both would read 0.02.
    with pytest.raises(BudgetTooSmall, match="a budget of 0.018 GiB leaves 2 .* minimum of 3 .* a VRAM budget of at least 0.019 GiB"):
        geometry().slots_for_budget(16 * 2**20 + 2 * 2**20)
    with pytest.raises(BudgetTooSmall, match="a budget of 0.01 GiB .* at least 0.02 GiB"):
        geometry().slots_for_budget(12 * 2**20)
    # A budget saved as 0.001 read "a budget of 0.00 GiB", as if none were set.
    with pytest.raises(BudgetTooSmall, match="a budget of 0.001 GiB .* at least 0.02 GiB"):
        geometry().slots_for_budget(int(0.001 * 2**30))
    with pytest.raises(BudgetTooSmall, match="a budget of 0.000001 GiB .* at least 0.02 GiB"):
        geometry().slots_for_budget(int(0.000001 * 2**30))
    with pytest.raises(BudgetTooSmall):
        geometry().slots_for_ratio(0.0)
    # The least ratio named is the least of two decimals that works, as slots are rounded to the nearest.
    for total, top_k, below, least in ((128, 2, 0.01, 0.02), (24, 2, 0.10, 0.11), (24, 4, 0.18, 0.19)):
        with pytest.raises(BudgetTooSmall, match=f"a cache ratio of at least {least:.2f} or"):
            geometry(total_experts=total, top_k=top_k).slots_for_ratio(below)
        assert geometry(total_experts=total, top_k=top_k).slots_for_ratio(least) == top_k + 1
    # A layer whose top-k is every expert needs them all, not one more than there are.
    with pytest.raises(BudgetTooSmall, match=r"minimum of 8 \(all its experts: top-k 8\)"):
        geometry(total_experts=8, top_k=8).slots_for_ratio(0.5)


def test_the_budget_sized_to_a_cuda_device_is_what_pytorch_holds_and_most_of_the_free_vram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gib, 24 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 * gib)
    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    assert Engine.free_memory_budget_gb(on_gpu) == pytest.approx(3 + 10 * (1 - FREE_MEMORY_MARGIN))
    assert Engine.free_memory_budget_gb(SimpleNamespace(device=torch.device("cpu"))) is None
