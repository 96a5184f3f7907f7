"""A GPU's ordering rules played on the CPU, so that ``CudaCopier`` runs where there is no GPU.

A real GPU runs a stream's work later than the host issues it, in order, and another stream
sees it only through events. ``FakeGPU`` keeps that much: a non-blocking copy issued on a side
stream is queued, not done, and so is the unpacking of a packed expert there (its kernels). Each
piece of work takes ``seconds_per_copy`` after the one before; it lands when the host next asks
an event whether it has passed, once its time has come, or at once when a stream waits for an
event after it or the host synchronises on one. Compute runs on the CPU at
once, as the default stream's work, so a kernel that reads a slot before its copy was waited for
reads what the slot held before: a missing ``wait_event`` shows up as wrong tokens, as it would on
a GPU, only every time. A copy made to wait for the layer reading its slot cannot be checked here:
that layer has always finished.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from seqmoe.compression import PackedExpert


class FakeStream:
    def __init__(self, seconds_per_copy: float = 0.0) -> None:
        self.seconds_per_copy = seconds_per_copy
        self._work: deque[tuple[float, Callable[[], None]]] = deque()
        """Each queued copy with the time it will have landed by."""
        self._free_at = 0.0
        self.issued = 0
        self.finished = 0

    def enqueue(self, work: Callable[[], None]) -> None:
        self._free_at = max(self._free_at, time.perf_counter()) + self.seconds_per_copy
        self._work.append((self._free_at, work))
        self.issued += 1

    def run_until(self, mark: int) -> None:
        while self.finished < mark:
            self._work.popleft()[1]()
            self.finished += 1

    def catch_up(self) -> None:
        """Land the copies whose time has come."""
        now = time.perf_counter()
        while self._work and self._work[0][0] <= now:
            self.run_until(self.finished + 1)

    def wait_event(self, event: FakeEvent) -> None:
        # This stream's later work starts after the event; the default stream's work is the
        # CPU's, which runs next, so what the event covers must be done now.
        if event.stream is not None:
            event.stream.run_until(event.mark)

    def synchronize(self) -> None:
        self.run_until(self.issued)


class FakeEvent:
    def __init__(self, enable_timing: bool = False, **_: object) -> None:
        self.stream: FakeStream | None = None
        self.mark = 0
        self.at = 0.0

    def record(self, stream: FakeStream) -> None:
        self.stream, self.mark, self.at = stream, stream.issued, time.perf_counter()

    def query(self) -> bool:
        if self.stream is None:
            return True
        self.stream.catch_up()
        return self.stream.finished >= self.mark

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_until(self.mark)

    def elapsed_time(self, later: FakeEvent) -> float:
        return 1000.0 * (later.at - self.at)


class FakeGPU:
    """Installs the fake streams and events in ``torch.cuda`` for one test (``monkeypatch``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds_per_copy: float) -> None:
        self.default = FakeStream()
        self.current = self.default
        self.side_streams: list[FakeStream] = []
        real_copy = torch.Tensor.copy_

        def copy(tensor: torch.Tensor, source: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
            if non_blocking and self.current is not self.default:
                self.current.enqueue(lambda: real_copy(tensor, source))
                return tensor
            return real_copy(tensor, source, non_blocking=non_blocking)

        def stream(device: object = None) -> FakeStream:
            made = FakeStream(seconds_per_copy)
            self.side_streams.append(made)
            return made

        real_unpack = PackedExpert.write_into

        def unpack(expert: PackedExpert, destinations: Sequence[torch.Tensor], non_blocking: bool = False) -> None:
            # Its kernels run on the stream, after the work queued there before them.
            if non_blocking and self.current is not self.default:
                self.current.enqueue(lambda: real_unpack(expert, destinations))
            else:
                real_unpack(expert, destinations, non_blocking)

        monkeypatch.setattr(torch.Tensor, "copy_", copy)
        monkeypatch.setattr(PackedExpert, "write_into", unpack)
        monkeypatch.setattr(torch.cuda, "Stream", stream)
        monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(torch.cuda, "stream", self._on)

    @contextlib.contextmanager
    def _on(self, stream: FakeStream) -> Iterator[None]:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    @property
    def copies_not_landed(self) -> int:
        return sum(stream.issued - stream.finished for stream in self.side_streams)
