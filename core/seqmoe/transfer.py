"""Copy backends that move one expert from host memory into a device slot.

Both backends share one contract, so the cache and the policies never know which link
they drive:

* ``submit(job, urgent)`` queues a copy; urgent copies (misses) jump the queue.
* ``cancel(job)`` drops a copy that has not started.
* ``wait(job)`` makes the compute side wait until the slot holds the expert. The CUDA
  backend does this with ``wait_event`` on the compute stream (no CPU synchronisation);
  the emulated one blocks the calling thread, which *is* the compute stream on a CPU.
* ``release(slot)`` marks that the compute side finished reading a slot; a later copy
  into that slot is ordered after it.
* ``done(job)`` says, without waiting, whether the slot holds the expert.
* ``take_stalls()`` hands over the stalls measured since the last call (for the event
  stream); it keeps at most ``STALL_BACKLOG`` of them when nobody takes them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch

ExpertKey = tuple[int, int]
"""(MoE layer index, expert index within that layer)."""

STALL_BACKLOG = 4096


class JobState(Enum):
    QUEUED = "queued"
    COPYING = "copying"
    DONE = "done"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class CopyJob:
    """One expert's weights on their way into one slot."""

    key: ExpertKey
    slot: int
    write: Callable[[bool], None] | None
    """Writes the expert into the slot (``non_blocking``: on the current CUDA stream, without
    waiting for it); dropped once the copy is issued. The job outlives its copy (in the
    copier's records, in the slot table), and the slot's views it holds would keep the whole
    slot pool alive after a resize freed it."""
    nbytes: int
    """Bytes the copy moves over the link."""
    state: JobState = JobState.QUEUED
    urgent: bool = False
    """Submitted as a miss (compute already waits for it), not as a prefetch."""
    phase: str = "decode"
    """The phase that asked for the copy (``prefill`` or ``decode``), for its bytes' account."""
    cuda_event: object | None = None
    timing: tuple[object, object] | None = None


@dataclass(frozen=True)
class MeasuredStall:
    key: ExpertKey
    seconds: float
    urgent: bool
    phase: str


class StallLog:
    """The stalls a copier measured: totals per phase, and the latest ones until they are taken."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._latest: deque[MeasuredStall] = deque(maxlen=STALL_BACKLOG)

    def add(self, job: CopyJob, seconds: float, phase: str) -> None:
        self._totals[phase] = self._totals.get(phase, 0.0) + seconds
        self._latest.append(MeasuredStall(job.key, seconds, job.urgent, phase))

    def take(self) -> list[MeasuredStall]:
        taken = list(self._latest)
        self._latest.clear()
        return taken

    def seconds(self, phase: str | None = None) -> float:
        return sum(self._totals.values()) if phase is None else self._totals.get(phase, 0.0)


class Copier(Protocol):
    """The interface every copy backend implements (see the module docstring)."""

    link: str
    bytes_copied: int
    blocks_host: bool
    """Whether ``wait`` blocks the calling thread until the copy lands (the emulated link), so
    that host work done before it overlaps the copy; on CUDA only the compute stream waits."""

    def submit(self, job: CopyJob, urgent: bool = False) -> None: ...

    def cancel(self, job: CopyJob) -> bool: ...

    def wait(self, job: CopyJob, phase: str = "decode") -> None: ...

    def release(self, slot: int) -> None: ...

    def done(self, job: CopyJob) -> bool: ...

    def take_stalls(self) -> list[MeasuredStall]: ...

    def stall_seconds(self, phase: str | None = None) -> float: ...

    def seconds_per_copy(self, nbytes: int) -> float: ...

    def close(self) -> None: ...


class LinkSpeed:
    """A smoothed measurement of how long copies take, starting from a guess."""

    def __init__(self, bytes_per_s: float, alpha: float = 0.2) -> None:
        self.seconds_per_byte = 1.0 / bytes_per_s
        self.alpha = alpha

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.seconds_per_byte += self.alpha * (seconds / nbytes - self.seconds_per_byte)

    def seconds_for(self, nbytes: int) -> float:
        return nbytes * self.seconds_per_byte


class ModelledLane:
    """One copy lane whose timing is a model: the emulated link's and the simulator's.

    A copy occupies the lane for ``_lane_seconds(job)``, starting when both the lane is free
    and the copy was submitted; urgent copies go first, and a copy that compute waits for
    jumps the queue. The lane moves on lazily, whenever it is asked anything, from the times
    it recorded: a copy whose start has passed can no longer be cancelled, one whose finish
    has passed is done, and its bytes move then, so a slot holds its expert once its copy is
    done. A subclass gives the clock and how compute waits until a time.
    """

    blocks_host = True

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.bytes_copied = 0
        self._queue: deque[tuple[CopyJob, float]] = deque()
        """Copies waiting for the lane, each with its submission time."""
        self._running: dict[CopyJob, float] = {}
        """Copies on the lane or done but not yet noticed, each with its finish time."""
        self._free_at = 0.0
        self._stalls = StallLog()

    def _lane_seconds(self, job: CopyJob) -> float:
        raise NotImplementedError

    def _lane_bytes(self, job: CopyJob) -> int:
        raise NotImplementedError

    def _pass_until(self, when: float) -> None:
        """Let compute wait until the clock reads ``when``."""
        raise NotImplementedError

    def submit(self, job: CopyJob, urgent: bool = False) -> None:
        # Starts what the lane has started by now, before and after queueing, but writes nothing:
        # a write that fails (see ``_settle``) is raised where a copy is waited for or asked
        # about, never from queueing another one, which the cache must always be able to do.
        self._start_due()
        job.urgent = urgent
        if urgent:
            self._queue.appendleft((job, self.clock()))
        else:
            self._queue.append((job, self.clock()))
        self._start_due()

    def cancel(self, job: CopyJob) -> bool:
        self._settle()
        if take_queued(self._queue, job) is not None:
            job.state = JobState.CANCELLED
            return True
        return False

    def wait(self, job: CopyJob, phase: str = "decode") -> None:
        self._settle()
        if job.state is JobState.QUEUED and take_queued(self._queue, job) is not None:
            self._start(job, self.clock())
        finish, now = self._running.get(job), self.clock()
        if finish is not None and finish > now:
            self._pass_until(finish)
            self._stalls.add(job, self.clock() - now, phase)
        self._settle()

    def release(self, slot: int) -> None:
        """Compute on the CPU, real or simulated, is synchronous: once the layer returned, the slot
        is free to overwrite."""

    def done(self, job: CopyJob) -> bool:
        self._settle()
        return job.state is JobState.DONE

    def take_stalls(self) -> list[MeasuredStall]:
        return self._stalls.take()

    def stall_seconds(self, phase: str | None = None) -> float:
        return self._stalls.seconds(phase)

    def close(self) -> None:
        """Nothing runs in the background."""

    def _start(self, job: CopyJob, at: float) -> None:
        start = max(self._free_at, at)
        self._free_at = start + self._lane_seconds(job)
        self._running[job] = self._free_at
        job.state = JobState.COPYING
        # Counted when the copy starts, as on CUDA: a started copy is never taken back.
        self.bytes_copied += self._lane_bytes(job)

    def _settle(self) -> None:
        """Start what the lane has started by now and finish what it has finished. The lane is
        looked at in steps (a layer, a stall), so a copy queued behind another starts when the
        lane came free or when it was submitted, whichever is later, not at the step that
        notices it."""
        self._start_due()
        now = self.clock()
        for job in [j for j, finish in self._running.items() if finish <= now]:
            # Written before it leaves the lane's books: a write that fails (out of memory for
            # the unpacking) is retried at the next look, as the copier retries a CUDA copy.
            write_expert(job)
            del self._running[job]
            job.state = JobState.DONE

    def _start_due(self) -> None:
        while self._queue and self._free_at <= self.clock():
            self._start(*self._queue.popleft())


SPIN_SECONDS = 2e-4
"""The last stretch of a wait on the emulated link is spun, not slept: a sleeping thread wakes up
to about 0.1 ms late (Linux's timer slack and the scheduler)."""


class EmulatedCopier(ModelledLane):
    """A PCIe link emulated on the real clock: one lane, a copy taking ``latency + nbytes /
    bandwidth``, as a DMA engine moves bytes while compute runs.

    No thread moves the bytes: the lane is a model on the real clock, and the copy is made on
    the compute thread when the model says it is done (compute waits until then, as a CUDA
    stream waits on a copy's event). A copy thread cost every miss far more than its copy: the
    thread had to wake and take the interpreter lock to start the copy and again to signal it,
    which on a 25 GB/s link took 160-740 µs for a demo expert's copy of 14 µs. The
    memcpy itself (about 10 µs for a demo expert) is the compute thread's; for experts of
    megabytes it costs compute more than a DMA engine would.
    """

    link = "emulated"

    def __init__(self, gbytes_per_s: float = 25.0, latency_s: float = 10e-6) -> None:
        if gbytes_per_s <= 0:
            raise ValueError("link speed must be positive")
        super().__init__(time.perf_counter)
        self.bytes_per_s = gbytes_per_s * 1e9
        self.latency_s = latency_s

    def seconds_per_copy(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def _lane_seconds(self, job: CopyJob) -> float:
        return self.seconds_per_copy(job.nbytes)

    def _lane_bytes(self, job: CopyJob) -> int:
        return job.nbytes

    def _pass_until(self, when: float) -> None:
        left = when - time.perf_counter()
        if left > SPIN_SECONDS:
            time.sleep(left - SPIN_SECONDS)
        while time.perf_counter() < when:
            pass


def take_queued(queue: deque[tuple[CopyJob, float]], job: CopyJob) -> tuple[CopyJob, float] | None:
    """Remove ``job``'s entry (the job and its submission time) from a link's queue; ``None`` if
    it is not queued."""
    for entry in queue:
        if entry[0] is job:
            queue.remove(entry)
            return entry
    return None


def write_expert(job: CopyJob, non_blocking: bool = False) -> None:
    """Write ``job``'s expert into its slot, once (see ``CopyJob.write``)."""
    if job.write is not None:
        job.write(non_blocking)
        job.write = None


class CudaCopier:
    """Host-to-device copies from pinned memory on a dedicated CUDA stream.

    Only ``max_in_flight`` copies are issued to the stream at a time; the rest wait in a
    host-side queue, so an urgent copy (a miss) can still overtake planned prefetches.
    Each copy into a slot first waits for the event recorded when the compute stream
    last finished reading that slot, so a slot is never overwritten under a running
    kernel. A packed expert's bytes are copied, then unpacked into the slot, both on the
    copy stream, and its event follows both. Stall time is the time the compute stream spends in ``wait_event``, timed
    with CUDA events and summed lazily (no synchronisation on the hot path).
    """

    link = "cuda"
    blocks_host = False

    def __init__(self, device: torch.device, max_in_flight: int = 2) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.max_in_flight = max_in_flight
        self.bytes_copied = 0
        self.speed = LinkSpeed(20e9)
        self._pending: deque[CopyJob] = deque()
        self._failed: deque[CopyJob] = deque()
        """Copies whose issue failed (out of device memory for the unpacking, say), to issue again
        before any other. Some of their kernels may have been queued before the failure and
        written part of the slot: they count as started (``COPYING``) and are never cancelled,
        so the cache never gives their slot back to the expert they displaced."""
        self._in_flight: deque[CopyJob] = deque()
        self._released: dict[int, torch.cuda.Event] = {}
        self._unread: deque[tuple[CopyJob, str, torch.cuda.Event, torch.cuda.Event]] = deque()
        """Stalls the GPU may not have passed yet, oldest first (each read once, see ``_read_stalls``)."""
        self._stalls = StallLog()

    def submit(self, job: CopyJob, urgent: bool = False) -> None:
        job.urgent = urgent
        if urgent:
            self._pending.appendleft(job)
        else:
            self._pending.append(job)
        try:
            self._pump()
        except Exception:
            # The copy that failed to issue (this one or an earlier) waits in ``_failed``, and the
            # error is raised again where it is next issued: when compute waits for it, or when
            # the cache next asks about copies. Queueing always succeeds, as the cache needs.
            pass

    def cancel(self, job: CopyJob) -> bool:
        if job in self._pending:
            self._pending.remove(job)
            job.state = JobState.CANCELLED
            return True
        return False

    def wait(self, job: CopyJob, phase: str = "decode") -> None:
        if job.state is JobState.QUEUED:
            self._pending.remove(job)
            self._issue(job)
        elif job in self._failed:
            self._failed.remove(job)
            self._issue(job)
        event = job.cuda_event
        assert isinstance(event, torch.cuda.Event)
        if not event.query():
            compute = torch.cuda.current_stream(self.device)
            before = torch.cuda.Event(enable_timing=True)
            after = torch.cuda.Event(enable_timing=True)
            before.record(compute)
            compute.wait_event(event)
            after.record(compute)
            self._unread.append((job, phase, before, after))
        # From the compute stream's point of view the slot now holds the expert.
        job.state = JobState.DONE

    def release(self, slot: int) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._released[slot] = event

    def done(self, job: CopyJob) -> bool:
        # The cache asks at every layer: the moment to put waiting prefetches on the stream
        # once earlier copies finished, not only when the next copy is submitted.
        self._pump()
        if job.state is JobState.COPYING and job.cuda_event is not None and job.cuda_event.query():
            job.state = JobState.DONE
        return job.state is JobState.DONE

    def take_stalls(self) -> list[MeasuredStall]:
        """The stalls the GPU has already passed (querying events never blocks)."""
        self._read_stalls()
        return self._stalls.take()

    def stall_seconds(self, phase: str | None = None) -> float:
        if self._unread:
            self._unread[-1][3].synchronize()
        self._read_stalls()
        return self._stalls.seconds(phase)

    def _read_stalls(self) -> None:
        """Time the stalls the GPU has passed, in the order it passed them, once each: a long chat
        must not make every later call slower."""
        while self._unread and self._unread[0][3].query():
            job, phase, before, after = self._unread.popleft()
            self._stalls.add(job, before.elapsed_time(after) / 1000.0, phase)

    def seconds_per_copy(self, nbytes: int) -> float:
        return self.speed.seconds_for(nbytes)

    def close(self) -> None:
        self.stream.synchronize()

    def _pump(self) -> None:
        while self._in_flight and self._in_flight[0].cuda_event.query():
            job = self._in_flight.popleft()
            job.state = JobState.DONE
            began, ended = job.timing
            self.speed.observe(job.nbytes, began.elapsed_time(ended) / 1000.0)
        while self._failed and len(self._in_flight) < self.max_in_flight:
            self._issue(self._failed.popleft())
        while self._pending and len(self._in_flight) < self.max_in_flight:
            self._issue(self._pending.popleft())

    def _issue(self, job: CopyJob) -> None:
        with torch.cuda.stream(self.stream):
            released = self._released.pop(job.slot, None)
            if released is not None:
                self.stream.wait_event(released)
            began = torch.cuda.Event(enable_timing=True)
            began.record(self.stream)
            try:
                write_expert(job, non_blocking=True)
            except BaseException:
                job.state = JobState.COPYING
                self._failed.append(job)
                raise
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
        job.cuda_event = event
        job.timing = (began, event)
        job.state = JobState.COPYING
        self.bytes_copied += job.nbytes
        self._in_flight.append(job)
