"""A slow call (a hub request, a scan of the disk, the first import of PyTorch) run on a
thread of its own; its result or exception comes back on the GUI thread, unless the widget
that asked has gone by then. The threads are daemons: a hub request still retrying when the
app quits must not hold the app open."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, Signal, Slot

_pending: set[_Relay] = set()  # relays live until their answer is delivered


class _Relay(QObject):
    sig_answered = Signal(bool, object)  # succeeded, result or exception

    def __init__(self, guard: QObject, on_finished: Callable[[Any], None], on_failed: Callable[[Exception], None]) -> None:
        super().__init__()  # no parent: it lives on the GUI thread, owned by _pending
        self.guard, self.on_finished, self.on_failed = guard, on_finished, on_failed
        self.sig_answered.connect(self._deliver)

    @Slot(bool, object)
    def _deliver(self, succeeded: bool, value: object) -> None:
        _pending.discard(self)
        if not shiboken6.isValid(self.guard):
            return
        (self.on_finished if succeeded else self.on_failed)(value)

    def answer(self, succeeded: bool, value: object) -> None:
        """From the worker thread; the answer is queued to the GUI thread."""
        try:
            self.sig_answered.emit(succeeded, value)
        except RuntimeError:
            pass  # the app is closing and the relay is gone: nobody waits for this answer


def run_in_background(
    call: Callable[[], Any], on_finished: Callable[[Any], None], on_failed: Callable[[Exception], None], guard: QObject
) -> None:
    relay = _Relay(guard, on_finished, on_failed)
    _pending.add(relay)

    def work() -> None:
        try:
            result = call()
        except Exception as error:  # noqa: BLE001 - handed to the GUI thread, which reports it
            relay.answer(False, error)
        else:
            relay.answer(True, result)

    threading.Thread(target=work, daemon=True, name="background").start()
