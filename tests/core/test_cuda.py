"""The CUDA path: pinned host memory, a copy stream and events. Skipped without an NVIDIA GPU."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
import torch

from seqmoe import Engine, Sampling, load_model
from seqmoe.compression import RawExpert
from seqmoe.pinned import PAGE, CudaHostRegistry, PinnedBuffers
from seqmoe.transfer import CopyJob, CudaCopier

from .test_equivalence import PROMPT, reference_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with a CUDA build of PyTorch")


def test_host_memory_is_page_locked_at_its_size_copies_asynchronously_and_is_unlocked_with_its_owner() -> None:
    buffers = PinnedBuffers(CudaHostRegistry())
    size = 5 * 2**20 + 3  # PyTorch's pinned allocator would lock 8 MiB
    source = buffers.copy(torch.arange(size, dtype=torch.uint8))
    assert source.is_pinned()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        copied = source.to("cuda", non_blocking=True)
    stream.synchronize()
    assert torch.equal(copied.cpu(), torch.arange(size, dtype=torch.uint8))
    address = source.data_ptr()
    del buffers
    assert not source.is_pinned()
    # Unlocked: the same range can be locked again (the driver refuses a range locked twice).
    registry = CudaHostRegistry()
    registry.register(address, PAGE)
    registry.unregister(address)


def test_a_failed_registration_is_said_and_leaves_no_error_for_the_next_kernel() -> None:
    buffers = PinnedBuffers(CudaHostRegistry())
    region = buffers.empty(PAGE)
    with pytest.raises(RuntimeError, match="cudaHostRegister failed"):
        CudaHostRegistry().register(region.data_ptr(), PAGE)  # a range registered twice
    assert torch.ones(4, device="cuda").sum().item() == 4


def _one_at_a_time(count: int) -> tuple[CudaCopier, list[torch.Tensor], list[CopyJob]]:
    """A copier with one copy on the stream at a time, and ``count`` 4 MiB jobs: job ``i``
    fills slot ``i`` with the value ``i``."""
    device = torch.device("cuda")
    sources = [torch.full((2**20,), float(i)).pin_memory() for i in range(count)]
    slots = [torch.empty(2**20, device=device) for _ in range(count)]
    jobs = [CopyJob((0, i), i, partial(RawExpert((sources[i],)).write_into, [slots[i]]), 4 * 2**20) for i in range(count)]
    return CudaCopier(device, max_in_flight=1), slots, jobs


def test_copies_land_in_order_and_urgent_ones_overtake() -> None:
    copier, slots, jobs = _one_at_a_time(4)
    for j in jobs[:3]:
        copier.submit(j)
    copier.submit(jobs[3], urgent=True)
    for j in jobs:
        copier.wait(j)
    torch.cuda.synchronize()
    assert [s[0].item() for s in slots] == [0.0, 1.0, 2.0, 3.0]
    assert copier.bytes_copied == 16 * 2**20


def test_queued_prefetches_start_while_the_cache_polls_them() -> None:
    copier, slots, jobs = _one_at_a_time(3)
    for j in jobs:
        copier.submit(j)
    deadline = time.monotonic() + 10
    # No further submit: the queued copies must still reach the stream.
    while not copier.done(jobs[-1]):
        assert time.monotonic() < deadline, "a queued prefetch never started"
    torch.cuda.synchronize()
    assert [s[0].item() for s in slots] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", [None, "bfloat16"])  # bfloat16: packed experts, unpacked on the copy stream
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss", "deepseek_v3"])
def test_offloaded_cuda_generation_matches_cuda_reference(tiny_models: dict[str, Path], family: str, dtype: str | None) -> None:
    greedy = Sampling(max_new_tokens=12)
    engine = Engine(load_model(str(tiny_models[family]), device="cuda", dtype=dtype))
    host = engine.loaded.host
    assert host.packed == (dtype == "bfloat16")
    first = host.expert((0, 0))
    assert (first.data if host.packed else first.tensors[0]).is_pinned()
    try:
        engine.configure("full")
        expected = engine.generate(PROMPT, greedy).token_ids
        for ratio in (0.5, engine.geometry.minimum_slots / engine.geometry.total_experts):
            engine.configure("lru", cache_ratio=ratio)
            result = engine.generate(PROMPT, greedy)
            assert result.token_ids == expected
            assert result.stats.link == "cuda" and result.stats.misses > 0
        # gate's look-ahead runs the routers (DeepSeek-V3: whole blocks) on the GPU, the experts in host memory.
        engine.configure("gate", cache_ratio=0.5)
        result = engine.generate(PROMPT, greedy)
        assert result.token_ids == expected and result.stats.prefetch_issued > 0
    finally:
        engine.close()
    # transformers' own generate on the same GPU, which decodes grouped_mm models with batched_mm.
    options = {"dtype": torch.bfloat16} if dtype else {}
    assert expected == reference_tokens(tiny_models[family], greedy, device="cuda", **options)
