"""VRAM from NVML and RAM from psutil, sampled on a thread of their own. No Qt in here.

Nothing here ever raises: a missing or failing NVML (no NVIDIA driver, no GPU, a call that
errors) becomes a one-line reason, and the panel goes on with the engine's own figures.
A probe that once broke model loading in another chat app is the reason for the care.
NVML's PCIe counter blocks for its 20 ms sampling window, so sampling stays off the GUI
thread; the panel reads ``latest``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.5
NO_NVML = "No NVIDIA GPU / NVML unavailable"


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total: int
    used: int  # by every process
    this_process: int
    pcie_rx_bytes_per_s: float | None  # host to device; None where NVML cannot measure it

    @property
    def available_to_this_process(self) -> int:
        """What a budget of this process could use: the free memory plus what it already holds."""
        return self.total - self.used + self.this_process


@dataclass(frozen=True)
class SystemMemory:
    total: int
    used: int
    this_process: int


@dataclass(frozen=True)
class MemorySample:
    gpu: GpuMemory | None
    gpu_problem: str  # why there is no ``gpu``: "No NVIDIA GPU / NVML unavailable: <reason>"
    ram: SystemMemory | None
    ram_problem: str


class _Nvml:
    """One NVML device. A failed start is final (the library will not appear later); a failed
    reading is reported and tried again at the next sample."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._handle = None
        self._start_problem = ""

    def read(self) -> tuple[GpuMemory | None, str]:
        if self._start_problem:
            return None, self._start_problem
        try:
            import pynvml

            if self._handle is None:
                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as error:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self._start_problem = f"{NO_NVML}: {_reason(error)}"
            return None, self._start_problem
        try:
            return self._read(pynvml), ""
        except Exception as error:  # any NVML call may fail on a given driver or GPU
            return None, f"{NO_NVML}: {_reason(error)}"

    def _read(self, pynvml) -> GpuMemory:
        handle = self._handle
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        pid = os.getpid()
        ours = sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid)
        try:
            # KB/s received by the GPU over its last 20 ms.
            rx = pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
        except pynvml.NVMLError:
            rx = None
        return GpuMemory(name if isinstance(name, str) else name.decode(), memory.total, memory.used, ours, rx)


def _reason(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


def read_system_memory() -> tuple[SystemMemory | None, str]:
    try:
        import psutil

        virtual = psutil.virtual_memory()
        return SystemMemory(virtual.total, virtual.total - virtual.available, psutil.Process().memory_info().rss), ""
    except Exception as error:  # psutil missing or refused by the platform
        return None, f"RAM figures unavailable: {_reason(error)}"


class MemoryMonitor:
    """Samples every ``interval_s`` on a daemon thread between ``start`` and ``stop``."""

    def __init__(self, device_index: int = 0, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.latest: MemorySample | None = None
        self._nvml = _Nvml(device_index)
        self._stopped: threading.Event | None = None

    def use_device(self, device_index: int) -> None:
        if device_index != self._nvml.device_index:
            self._nvml = _Nvml(device_index)

    def sample(self) -> MemorySample:
        gpu, gpu_problem = self._nvml.read()
        ram, ram_problem = read_system_memory()
        self.latest = MemorySample(gpu, gpu_problem, ram, ram_problem)
        return self.latest

    def current(self) -> MemorySample:
        """The latest sample while sampling, else a fresh one (NVML's PCIe reading takes 20 ms)."""
        latest = self.latest
        return latest if latest is not None and self.running else self.sample()

    @property
    def running(self) -> bool:
        return self._stopped is not None

    def start(self) -> None:
        if self._stopped is None:
            self._stopped = threading.Event()
            threading.Thread(target=self._run, args=(self._stopped,), name="panel-memory", daemon=True).start()

    def stop(self) -> None:
        """Returns at once: the thread ends after its current sample (the GUI never waits for NVML)."""
        if self._stopped is not None:
            self._stopped.set()
            self._stopped = None

    def _run(self, stopped: threading.Event) -> None:
        while not stopped.is_set():
            try:
                self.sample()
            except Exception:  # a bug here must cost the figures, never the app
                log.exception("sampling memory failed")
            stopped.wait(self.interval_s)
