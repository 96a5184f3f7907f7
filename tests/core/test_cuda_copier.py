"""``CudaCopier`` on the CPU, against a fake GPU that keeps a GPU's ordering (``fake_gpu``).

The CUDA tests (``test_cuda.py``) need a GPU. These run its copier's queue, events and waits
everywhere, through the whole engine: a wait that is missing or in the wrong place lets a layer
compute with a slot whose copy has not landed, and the tokens change.
"""

from __future__ import annotations

import random
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from seqmoe import Engine, Sampling, load_model
from seqmoe.cache import ExpertCache
from seqmoe import transfer
from seqmoe.compression import RawExpert
from seqmoe.errors import SeqMoEError
from seqmoe.events import EventBus, Stall
from seqmoe.experts import _RUNTIME_ATTR, OffloadedLayer
from seqmoe.policies import BeladyPolicy, LRUPolicy
from seqmoe.store import HostStore
from seqmoe.transfer import CopyJob, CudaCopier, JobState

from .fake_gpu import FakeGPU
from .test_cache import FakeExperts
from .test_equivalence import NEW_TOKENS, PROMPT
from .test_policies import fake_host, random_forecasts, run_random_chat

CPU = torch.device("cpu")


def jobs(count: int) -> tuple[list[torch.Tensor], list[CopyJob]]:
    """``count`` jobs, job ``i`` filling slot ``i`` (zeros) with the value ``i + 1``."""
    slots = [torch.zeros(64) for _ in range(count)]
    made = [CopyJob((0, i), i, partial(RawExpert((torch.full((64,), float(i + 1)),)).write_into, [slots[i]]), 256)
            for i in range(count)]
    return slots, made


def test_a_copy_lands_when_compute_waits_for_it_and_a_held_back_one_can_be_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = FakeGPU(monkeypatch, seconds_per_copy=60.0)
    copier = CudaCopier(CPU, max_in_flight=1)
    slots, (first, second, third) = jobs(3)
    for job in (first, second, third):
        copier.submit(job)
    assert gpu.copies_not_landed == 1 and slots[0][0].item() == 0.0  # on the stream, not landed
    assert copier.cancel(third) and third.state is JobState.CANCELLED
    copier.wait(second)
    assert [slot[0].item() for slot in slots] == [1.0, 2.0, 0.0]  # the stream runs in order
    assert copier.bytes_copied == 512


def test_urgent_copies_overtake_prefetches_and_polling_starts_the_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeGPU(monkeypatch, seconds_per_copy=0.01)
    copier = CudaCopier(CPU, max_in_flight=1)
    slots, made = jobs(4)
    for job in made[:3]:
        copier.submit(job)
    copier.submit(made[3], urgent=True)
    copier.wait(made[3])
    assert slots[3][0].item() == 4.0 and slots[2][0].item() == 0.0
    deadline = time.monotonic() + 10
    while not copier.done(made[2]):  # no further submit: the cache's polling moves the queue on
        assert time.monotonic() < deadline, "a queued prefetch never reached the stream"
        time.sleep(0.001)
    assert slots[2][0].item() == 3.0


def test_a_copy_into_a_released_slot_lands_and_its_stall_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU(monkeypatch, seconds_per_copy=60.0)
    copier = CudaCopier(CPU)
    slots, (job,) = jobs(1)
    copier.release(0)
    copier.submit(job)
    assert gpu.copies_not_landed == 1
    copier.wait(job)
    assert slots[0][0].item() == 1.0 and gpu.copies_not_landed == 0
    assert [stall.key for stall in copier.take_stalls()] == [(0, 0)]


@pytest.mark.parametrize(
    ("family", "dtype"), [("mixtral", None), ("qwen3_moe", None), ("jamba", None), ("mixtral", "bfloat16"), ("qwen3_moe", "bfloat16")]
)
def test_offloaded_generation_through_the_cuda_copier_matches_full(
    tiny_models: dict[str, Path], family: str, dtype: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bfloat16: packed experts, unpacked on the copy stream after their bytes."""
    engine = Engine(load_model(str(tiny_models[family]), device="cpu", dtype=dtype))
    assert engine.loaded.host.packed == (dtype == "bfloat16")
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    try:
        engine.configure("full")
        expected = engine.generate(PROMPT, greedy).token_ids
        gpu = FakeGPU(monkeypatch, seconds_per_copy=2e-4)
        monkeypatch.setattr(Engine, "_make_copier", lambda self: CudaCopier(self.device))
        minimum = engine.geometry.minimum_slots / engine.geometry.total_experts
        for policy, ratio in [("lru", minimum), ("gate", minimum), ("seqmoe", 0.5)]:
            engine.configure(policy, cache_ratio=ratio)
            result = engine.generate(PROMPT, greedy)
            assert result.token_ids == expected, f"{family} {policy} at cache ratio {ratio:.2f}"
            assert result.stats.misses > 0 and result.stats.h2d_bytes > 0
        engine.resize(cache_ratio=minimum)  # waits for the copies still on the stream, then rebuilds the pool
        assert engine.generate(PROMPT, greedy).token_ids == expected
        assert sum(stream.issued for stream in gpu.side_streams) > 0  # the copies went over the fake copy stream
    finally:
        engine.close()


@pytest.mark.parametrize("cuda", [False, True])
def test_a_layer_plans_its_copies_in_the_wait_on_the_emulated_link_and_after_launching_its_experts_on_cuda(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, cuda: bool
) -> None:
    """The emulated link's wait blocks the host, which plans in it, so the copies are queued before
    the layer computes; on CUDA nothing blocks the host, which plans while the GPU computes."""
    engine = Engine(load_model(str(tiny_models["qwen3_moe"]), device="cpu"))
    if cuda:
        FakeGPU(monkeypatch, seconds_per_copy=2e-4)
        monkeypatch.setattr(Engine, "_make_copier", lambda self: CudaCopier(self.device))
    order: list[tuple[str, int]] = []
    plan = OffloadedLayer._plan
    monkeypatch.setattr(OffloadedLayer, "_plan", lambda self, forecasts: (order.append(("plan", self.layer)), plan(self, forecasts)))
    try:
        engine.configure("gate", cache_ratio=0.5)  # forecasts at every decode layer
        for module in engine.loaded.experts:
            runtime = module.__dict__[_RUNTIME_ATTR]
            runtime.base = partial(lambda base, layer, *args: (order.append(("compute", layer)), base(*args))[1], runtime.base, runtime.layer)
        engine.generate(PROMPT, Sampling(max_new_tokens=NEW_TOKENS))
    finally:
        engine.close()
    planned = [at for at, (what, _) in enumerate(order) if what == "plan"]
    assert len(planned) >= NEW_TOKENS - 1
    neighbour = -1 if cuda else 1
    assert all(order[at + neighbour] == ("compute", order[at][1]) for at in planned)


def test_a_cache_filled_before_the_first_prompt_leaves_its_first_layer_no_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeGPU(monkeypatch, seconds_per_copy=60.0)
    copier = CudaCopier(CPU)
    prior = torch.full((3, 4), 0.1)
    prior[1, 2] = prior[2, 0] = 0.9
    host = HostStore([FakeExperts(layer) for layer in range(3)], pinned=None)
    events = EventBus()
    heard: list[object] = []
    events.subscribe(heard.append)
    cache = ExpertCache(host, 2, CPU, copier, BeladyPolicy(3, prior), events)
    cache.warm()
    slot = cache.acquire(1, [2], prefill=True)
    assert host.expert((1, 2)).tensors[0].equal(cache.pool.tensors["gate_up_proj"][slot[0]])  # landed, as the layer reads it
    assert cache.phases["prefill"].hits == 1 and not [event for event in heard if isinstance(event, Stall)]


@pytest.mark.parametrize(("policy", "ratio"), [("lru", None), ("seqmoe", 0.5)])
def test_a_copy_out_of_device_memory_fails_its_reply_clearly_and_the_next_reply_is_right(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, policy: str, ratio: float | None
) -> None:
    """``lru`` at its smallest cache fails a miss's copy, ``seqmoe`` a prefetch's or a miss's."""
    engine = Engine(load_model(str(tiny_models["mixtral"]), device="cpu"))
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    try:
        engine.configure("full")
        expected = engine.generate(PROMPT, greedy).token_ids
        FakeGPU(monkeypatch, seconds_per_copy=2e-4)
        monkeypatch.setattr(Engine, "_make_copier", lambda self: CudaCopier(self.device))
        engine.configure(policy, cache_ratio=ratio or engine.geometry.minimum_slots / engine.geometry.total_experts)
        issued = 0

        def out_of_memory_once(job: CopyJob, non_blocking: bool = False) -> None:
            nonlocal issued
            issued += 1
            if issued == 3:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
            write(job, non_blocking)

        write = transfer.write_expert
        monkeypatch.setattr(transfer, "write_expert", out_of_memory_once)
        with pytest.raises(SeqMoEError, match="ran out of memory while generating; choose a smaller VRAM budget"):
            engine.generate(PROMPT, greedy)
        assert engine.generate(PROMPT, greedy).token_ids == expected
        assert issued > 3
    finally:
        engine.close()


def lru_cache_on_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> ExpertCache:
    """Three slots filled with layer 0's experts; copies take a minute each and one runs at a time."""
    FakeGPU(monkeypatch, seconds_per_copy=60.0)
    host = HostStore([FakeExperts(layer) for layer in range(3)], pinned=None)
    cache = ExpertCache(host, 3, CPU, CudaCopier(CPU, max_in_flight=1), LRUPolicy(3, 4), EventBus())
    cache.release(cache.acquire(0, [0, 1, 2], prefill=False))
    return cache


def test_a_held_back_prefetch_that_fails_partway_is_not_cancelled_back_into_its_victims_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = lru_cache_on_fake_gpu(monkeypatch)
    victims = cache._victims()
    cache._prefetch((1, 0), victims, "decode", admit_all=True)  # on the stream
    cache._prefetch((1, 1), victims, "decode", admit_all=True)  # held back on the host
    held_back, victim = cache._queued[(1, 1)], cache._displaced[(1, 1)]
    destinations = held_back.write.args[0]

    def runs_out_of_memory_partway(non_blocking: bool) -> None:
        destinations[0].fill_(-1.0)  # a kernel queued before the allocation that failed
        held_back.write = write
        raise torch.OutOfMemoryError("CUDA out of memory")

    write, held_back.write = held_back.write, runs_out_of_memory_partway
    cache.copier.wait(cache._queued[(1, 0)])
    with pytest.raises(torch.OutOfMemoryError):
        cache._settle_queued()  # the first landed; issuing the second fails
    cache.end_of_generation()
    slots = cache.acquire(victim[0], [victim[1]], prefill=False)
    assert cache.pool.tensors["gate_up_proj"][slots[0]][0, 0].item() == 100.0 * victim[0] + victim[1]


def test_a_prefetch_whose_copy_fails_as_it_is_queued_leaves_the_cache_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = lru_cache_on_fake_gpu(monkeypatch)
    write, failures = transfer.write_expert, [torch.OutOfMemoryError("CUDA out of memory")]

    def fails_once(job: CopyJob, non_blocking: bool = False) -> None:
        if failures:
            raise failures.pop()
        write(job, non_blocking)

    monkeypatch.setattr(transfer, "write_expert", fails_once)
    victims = cache._victims()
    victim = victims.peek()
    cache._prefetch((1, 0), victims, "decode", admit_all=True)
    cache.end_of_generation()
    for key in (victim, (1, 0)):
        slots = cache.acquire(key[0], [key[1]], prefill=False)
        assert cache.pool.tensors["gate_up_proj"][slots[0]][0, 0].item() == 100.0 * key[0] + key[1]
        cache.release(slots)


@pytest.mark.parametrize("link", ["emulated", "cuda"])
@pytest.mark.parametrize("failing", [1, 2, 3, 5, 8, 13])
def test_a_copy_that_fails_after_writing_part_of_its_slot_never_lets_that_slot_be_read_as_an_expert(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, link: str, failing: int
) -> None:
    """On a GPU the kernels a copy queued before running out of memory still run: its slot holds
    neither the expert it was meant for nor the one it displaced. Whichever copy fails (a miss, a
    prefetch, one issued while queueing another), the reply either fails clearly or gives
    ``full``'s tokens, and so does the next."""
    engine = Engine(load_model(str(tiny_models["mixtral"]), device="cpu"))
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    try:
        engine.configure("full")
        expected = engine.generate(PROMPT, greedy).token_ids
        if link == "cuda":
            FakeGPU(monkeypatch, seconds_per_copy=2e-4)
            monkeypatch.setattr(Engine, "_make_copier", lambda self: CudaCopier(self.device))
        engine.configure("seqmoe", cache_ratio=0.5)
        written = 0

        def fails_after_writing_part(job: CopyJob, non_blocking: bool = False) -> None:
            nonlocal written
            written += 1
            if written == failing:
                for destination in job.write.args[0]:
                    destination.view(-1)[: destination.numel() // 2].fill_(1e4)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
            write(job, non_blocking)

        write = transfer.write_expert
        monkeypatch.setattr(transfer, "write_expert", fails_after_writing_part)
        try:
            assert engine.generate(PROMPT, greedy).token_ids == expected
        except SeqMoEError as error:
            assert "ran out of memory while generating" in str(error)
        assert written >= failing
        assert engine.generate(PROMPT, greedy).token_ids == expected
    finally:
        engine.close()


@pytest.mark.parametrize("size", range(2, 11))
def test_no_expert_in_use_is_overwritten_through_the_cuda_copier_under_random_forecasts(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """``test_policies``' random chat on the copy stream: copies land only when compute waits for
    them or asks, two at a time on the stream, the rest held back, so a wait, cancel or reuse of
    a slot out of place leaves a layer reading weights that are not its experts'."""
    FakeGPU(monkeypatch, seconds_per_copy=3e-3)
    rng = random.Random(size)
    policy = random_forecasts(seed=size)
    cache = ExpertCache(fake_host(), size, CPU, CudaCopier(CPU), policy, EventBus())
    run_random_chat(cache, policy, rng, pause=lambda: time.sleep(rng.random() * 0.001))
    assert (cache.prefetches.issued > 0) == (size > 2)
    if size >= 7:  # re-plans find prefetches still held back to cancel (from five slots up, timing allowing)
        assert cache.prefetches.cancelled > 0
