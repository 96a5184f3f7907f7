"""The emulated PCIe link: speed, queue order, cancellation."""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch

from seqmoe.compression import RawExpert
from seqmoe.transfer import CopyJob, EmulatedCopier, JobState


def job(slot: int, nbytes: int, tensors: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> CopyJob:
    """A copy of ``nbytes`` into slot ``slot``; ``tensors``, if given, is told the (destination, source)."""
    src = torch.randn(nbytes // 4)
    dst = torch.zeros_like(src)  # touched now: a first write faulting its pages in would count as link time
    if tensors is not None:
        tensors.append((dst, src))
    return CopyJob(key=(0, slot), slot=slot, write=partial(RawExpert((src,)).write_into, [dst]), nbytes=nbytes)


def copy_all(copier: EmulatedCopier, jobs: list[CopyJob]) -> float:
    """Queue every job, wait for each in order, and return the seconds it took."""
    start = time.perf_counter()
    for j in jobs:
        copier.submit(j)
    for j in jobs:
        copier.wait(j)
    elapsed = time.perf_counter() - start
    copier.close()
    return elapsed


@pytest.mark.parametrize("gbps", [0.25, 1.0])
def test_copies_take_the_set_speed_one_after_another(gbps: float) -> None:
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    jobs = [job(i, 2 * 2**20, pairs) for i in range(24)]
    elapsed = copy_all(EmulatedCopier(gbytes_per_s=gbps, latency_s=0.0), jobs)
    lane = sum(j.nbytes for j in jobs) / (gbps * 1e9)
    # Never faster than the setting; slower only by the host's own lateness in noticing the
    # last copy (the lane's times are a model), which a busy machine can stretch to tens of ms.
    assert lane <= elapsed < lane + max(0.2 * lane, 0.1)
    assert all(torch.equal(dst, src) for dst, src in pairs)
    assert not any(j.write for j in jobs)  # a finished job holds no view of the slot pool


def test_latency_is_charged_per_copy() -> None:
    elapsed = copy_all(EmulatedCopier(gbytes_per_s=1000.0, latency_s=0.02), [job(i, 1024) for i in range(5)])
    assert elapsed >= 5 * 0.02 * 0.95


def test_urgent_copy_overtakes_queued_prefetches_and_cancel_drops_one() -> None:
    copier = EmulatedCopier(gbytes_per_s=0.1, latency_s=0.0)
    blocker, queued, dropped, urgent = (job(i, 2 * 2**20) for i in range(4))
    for j in (blocker, queued, dropped):
        copier.submit(j)
    time.sleep(0.005)
    copier.submit(urgent, urgent=True)
    assert copier.cancel(dropped)
    copier.wait(urgent)
    assert queued.state is not JobState.DONE
    assert dropped.state is JobState.CANCELLED
    copier.wait(queued)
    copier.close()
    assert not copier.cancel(queued)


def test_wait_counts_stall_time() -> None:
    copier = EmulatedCopier(gbytes_per_s=0.1, latency_s=0.0)
    j = job(0, 2 * 2**20)
    copier.submit(j)
    copier.wait(j)
    copier.close()
    assert copier.stall_seconds() > 0.01


def test_a_copy_whose_write_fails_stays_on_the_lane_and_lands_when_waited_for_again() -> None:
    """Out of memory for the unpacking, say: the expert must not count as arrived unwritten."""
    copier = EmulatedCopier(gbytes_per_s=1000.0, latency_s=0.001)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    j = job(0, 1024, pairs)
    write, failures = j.write, [MemoryError("no memory for the unpacking")]

    def fails_once(non_blocking: bool) -> None:
        if failures:
            raise failures.pop()
        write(non_blocking)

    j.write = fails_once
    copier.submit(j)
    with pytest.raises(MemoryError):
        copier.wait(j)
    assert j.state is not JobState.DONE
    copier.wait(j)
    assert j.state is JobState.DONE and torch.equal(*pairs[0])
