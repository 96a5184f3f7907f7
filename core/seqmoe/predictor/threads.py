"""Running a tiny model on one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On the CPU, run the block on one thread. A forecast is a dozen tiny operations: waking
    the intra-op thread pool for each one costs more than the work (twice to three times the
    time on two cores)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
