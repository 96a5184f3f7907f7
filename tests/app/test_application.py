"""Starting the app: reference cycles are collected on the GUI thread alone."""

from __future__ import annotations

import gc
import threading
import weakref

from seqmoe_chat.application import garbage_collected_on_this_thread


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_garbage_made_on_another_thread_is_collected_on_the_gui_thread(qtbot) -> None:
    collected_on: list[threading.Thread] = []

    def record(phase: str, _info: dict) -> None:
        if phase == "start":
            collected_on.append(threading.current_thread())

    gc.callbacks.append(record)
    try:
        with garbage_collected_on_this_thread():
            # The engine's thread allocates far past Python's thresholds while it generates.
            engine = threading.Thread(target=lambda: [Cycle() for _ in range(50_000)])
            engine.start()
            engine.join()
            last = weakref.ref(Cycle())
            qtbot.waitUntil(lambda: last() is None, timeout=5_000)
    finally:
        gc.callbacks.remove(record)
    assert collected_on and set(collected_on) == {threading.main_thread()}
