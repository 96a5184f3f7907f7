"""A GPU's ordering rules played on the CPU, so that ``CudaCopier`` runs where there is no GPU.

A real GPU runs a stream's work later than the host issues it, in order, and another stream
sees it only through events. ``FakeGPU`` keeps that much: a non-blocking copy issued on a side
stream is queued, not done, and so are the kernels that unpack a packed expert there. Each
piece of work takes ``seconds_per_copy`` after the one before; it lands when the host next asks
an event whether it has passed, once its time has come, or at once when the compute stream
waits for an event after it or the host synchronises on one. A side stream that waits for an
event runs its later work after the event's. Compute runs on the CPU at
once, as the default stream's work, so a kernel that reads a slot before its copy was waited for
reads what the slot held before: a missing ``wait_event`` shows up as wrong tokens, as it would on
a GPU, only every time. A copy made to wait for the layer reading its slot cannot be checked here:
that layer has always finished.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator

import pytest
import torch

from seqmoe import compression


class FakeStream:
    def __init__(self, seconds_per_copy: float = 0.0) -> None:
        self.seconds_per_copy = seconds_per_copy
        self._work: deque[tuple[float, Callable[[], None], tuple[FakeStream, int] | None]] = deque()
        """Each queued piece of work: the time it will have landed by, and, for a wait for another
        stream's event, that stream and the event's mark (``None``: a copy or kernel)."""
        self._free_at = 0.0
        self.issued = 0
        self.finished = 0

    def enqueue(self, work: Callable[[], None]) -> None:
        self._free_at = max(self._free_at, time.perf_counter()) + self.seconds_per_copy
        self._work.append((self._free_at, work, None))
        self.issued += 1

    def run_until(self, mark: int) -> None:
        while self.finished < mark:
            self._work.popleft()[1]()
            self.finished += 1

    @property
    def not_landed(self) -> int:
        """Copies and kernels queued and not yet done."""
        return sum(waits_for is None for _, _, waits_for in self._work)

    def catch_up(self) -> None:
        """Land the copies whose time has come, and the work after a wait the other stream passed."""
        now = time.perf_counter()
        while self._work:
            landed_by, _, waits_for = self._work[0]
            if waits_for is not None:
                other, mark = waits_for
                other.catch_up()
                if other.finished < mark:
                    return
            elif landed_by > now:
                return
            self.run_until(self.finished + 1)

    def wait_event(self, event: FakeEvent) -> None:
        """This stream's later work starts after the event's."""
        other, mark = event.stream, event.mark
        if other is not None and other is not self:
            self._work.append((self._free_at, lambda: other.run_until(mark), (other, mark)))
            self.issued += 1

    def synchronize(self) -> None:
        self.run_until(self.issued)


class ComputeStream(FakeStream):
    """The default stream: its work is the CPU's, which runs at once, so what an event it waits for
    covers must be done now."""

    def wait_event(self, event: FakeEvent) -> None:
        if event.stream is not None:
            event.stream.run_until(event.mark)


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
        self.default = ComputeStream()
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

        real_unpack = compression.unpack_into

        def unpack(destination: torch.Tensor, *packed: object) -> None:
            # Its kernels run on the stream, after the work queued there before them.
            if self.current is not self.default:
                self.current.enqueue(lambda: real_unpack(destination, *packed))
            else:
                real_unpack(destination, *packed)

        monkeypatch.setattr(torch.Tensor, "copy_", copy)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda tensor, stream: None)
        monkeypatch.setattr(compression, "unpack_into", unpack)
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
        return sum(stream.not_landed for stream in self.side_streams)
