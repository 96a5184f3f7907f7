"""Page-locked host memory the size it was asked for, for asynchronous copies to a CUDA device.

PyTorch's pinned allocator (``pin_memory()``, ``pin_memory=True``) rounds every allocation up
to a power of two, and the host store's buffers are large and kept for the model's life: a
layer of OLMoE-1B-7B's packed experts (0.56 GiB) would lock 1 GiB, the model 16 GiB for 9. Here ordinary host memory is registered with the driver instead
(``cudaHostRegister``), whole pages and nothing more, and unregistered when its owner goes.
"""

from __future__ import annotations

import mmap
import weakref
from typing import Protocol

import torch

PAGE = mmap.PAGESIZE


class HostRegistry(Protocol):
    """Page-locks host memory for the device's copy engine, and lets it go."""

    def register(self, address: int, nbytes: int) -> None: ...

    def unregister(self, address: int) -> None: ...


class CudaHostRegistry:
    """The CUDA runtime's registry of page-locked host memory."""

    def __init__(self) -> None:
        self._cudart = torch.cuda.cudart()

    def register(self, address: int, nbytes: int) -> None:
        self._check(self._cudart.cudaHostRegister(address, nbytes, 0), "cudaHostRegister")

    def unregister(self, address: int) -> None:
        self._check(self._cudart.cudaHostUnregister(address), "cudaHostUnregister")

    def _check(self, status: object, call: str) -> None:
        code = int(getattr(status, "value", status))
        if code != 0:
            _take_last_error()
            # The loader turns a RuntimeError while pinning into its one-line refusal.
            raise RuntimeError(f"{call} failed: {self._cudart.cudaGetErrorString(status)}")


def _take_last_error() -> None:
    """A failed runtime call leaves its error as the thread's last one, and PyTorch's check after
    the next kernel launch would raise it there, against an innocent kernel: a launch here takes it."""
    try:
        torch.zeros(1, device="cuda").add_(1)
    except RuntimeError:
        pass


class PinnedBuffers:
    """Buffers page-locked through ``registry``, each its size rounded up to whole pages, all
    unregistered when this object goes (before their memory can be freed: the finalizer holds
    them until then)."""

    def __init__(self, registry: HostRegistry) -> None:
        self._registry = registry
        self._held: list[tuple[torch.Tensor, int]] = []
        """Each buffer's allocation and the address registered in it."""
        finalizer = weakref.finalize(self, _unregister_all, registry, self._held)
        finalizer.atexit = False  # the process's memory goes with it; the driver may be gone first

    def empty(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of page-locked bytes. They start at a page of their own and the pages they
        span are theirs alone: the driver refuses a page registered twice."""
        span = -(-max(nbytes, 1) // PAGE) * PAGE
        allocation = torch.empty(span + PAGE, dtype=torch.uint8)
        offset = -allocation.data_ptr() % PAGE
        region = allocation[offset : offset + span]
        self._registry.register(region.data_ptr(), span)
        self._held.append((allocation, region.data_ptr()))
        return region[:nbytes]

    def release(self, buffer: torch.Tensor) -> None:
        """Unlock ``buffer`` (given by ``empty``, or a view from its start) and let its memory go
        with the last reference to it."""
        for index, (_, address) in enumerate(self._held):
            if address == buffer.data_ptr():
                self._registry.unregister(address)
                del self._held[index]
                return
        raise ValueError("not a buffer of these pinned buffers")

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A page-locked copy of ``tensor`` (contiguous, same dtype and shape)."""
        source = tensor.detach().to("cpu").contiguous()
        pinned = self.empty(source.numel() * source.element_size()).view(source.dtype).view(source.shape)
        pinned.copy_(source)
        return pinned


def _unregister_all(registry: HostRegistry, held: list[tuple[torch.Tensor, int]]) -> None:
    while held:
        _, address = held.pop()
        registry.unregister(address)
