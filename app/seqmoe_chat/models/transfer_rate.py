"""Speed and time left of a transfer, over a sliding window so a pause shows quickly."""

from __future__ import annotations

from collections import deque

WINDOW_S = 8.0


class TransferRate:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done_bytes: int) -> None:
        if self._samples and done_bytes < self._samples[-1][1]:
            self._samples.clear()  # a file started again from zero
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def reset(self) -> None:
        self._samples.clear()

    def bytes_per_s(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def seconds_left(self, remaining: int) -> float | None:
        speed = self.bytes_per_s()
        return remaining / speed if speed > 0 else None
