"""Measures how long the GUI thread's event loop goes without turning.

A precise timer asks to run every ``TICK_MS``; any extra gap between two runs is time
the event loop was blocked. The longest such gap while a reply streams is the figure to
keep under 50 ms.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QTimer

TICK_MS = 10


class StallMonitor(QObject):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)
        self._last = 0.0
        self.longest_ms = 0.0

    def start(self) -> None:
        self.longest_ms = 0.0
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> float:
        """Stop measuring; returns the longest stall in milliseconds."""
        if self._timer.isActive():
            self._tick()
            self._timer.stop()
        return self.longest_ms

    def _tick(self) -> None:
        now = time.perf_counter()
        self.longest_ms = max(self.longest_ms, (now - self._last) * 1000 - TICK_MS)
        self._last = now
