"""Signals that end a command (``timeout``, a closed terminal, a service manager) unwind it as
Ctrl+C does, so that what it was writing is cleaned up on the way out instead of left half
written by the default handler, which ends the process on the spot."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# SIGHUP: the terminal closed (POSIX only). SIGBREAK: Ctrl+Break, or the console window closed (Windows only).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGBREAK") if hasattr(signal, name))


class Terminated(BaseException):
    """A stop signal arrived. A ``BaseException``, as ``KeyboardInterrupt`` is: no ``except
    Exception`` on the way swallows it, and every ``finally`` runs."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number

    @property
    def name(self) -> str:
        return signal.Signals(self.number).name

    @property
    def exit_status(self) -> int:
        """128 + the signal's number: what a shell reports for a process the signal ended."""
        return 128 + self.number


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """In the block, a stop signal raises ``Terminated`` in the main thread; the handlers found
    are restored after it. Outside the main thread, where Python sets no handlers, nothing changes.
    Not nested: an inner block's end would restore the outer ``stop``, which a second signal then runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # An ignored signal stays ignored: ``nohup`` starts a command so that closing its terminal
    # (SIGHUP) does not end it.
    previous = {number: handler for number in STOP_SIGNALS if (handler := signal.getsignal(number)) is not signal.SIG_IGN}

    def stop(number: int, frame: FrameType | None) -> None:
        # Once is enough: a second signal would cut short the cleanup the first one started.
        for other in previous:
            signal.signal(other, signal.SIG_IGN)
        raise Terminated(number)

    for number in previous:
        signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            # ``None``: a handler not set from Python, which Python cannot set back; the default is the nearest.
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
