"""The counters of the current reply: speed, hits, prefetch quality, copies, stalls."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from .memory_monitor import MemorySample
from .telemetry_model import TelemetryModel
from .text_rows import TextRows

ROWS = ("tokens/s", "hit rate", "prefetch precision", "unused prefetches", "PCIe", "time stalled")
TOOLTIPS = {
    "tokens/s": "Generating, after the first token; the first one's wait is mostly reading the prompt",
    "hit rate": "Experts found in the cache while generating; reading the prompt streams most of them in",
    "prefetch precision": "Prefetched experts that a layer then used, per prefetch copied",
    "unused prefetches": "Prefetched experts evicted before any layer used them",
    "PCIe": "Host-to-device copies: NVML's measurement on a GPU, else the engine's own copies",
}


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


class CountersView(TextRows):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(ROWS, TOOLTIPS, parent)

    def show_model(self, model: TelemetryModel | None, memory: MemorySample | None) -> None:
        if model is None:
            self.set_values(dict.fromkeys(ROWS, "–"))
            return
        counters = model.counters
        speed, first = counters.decode_tokens_per_s, counters.first_token_seconds
        self.set_values({
            "tokens/s": "–" if speed is None or first is None
                        else f"{speed:.1f} ({counters.tokens} tokens, the first after {first:.2f} s)",
            "hit rate": f"{_share(counters.decode_hit_rate)} ({counters.decode_hits} hits, {counters.decode_late} late, "
                        f"{counters.decode_misses} misses; with the prompt {_share(counters.hit_rate)})",
            "prefetch precision": f"{_share(counters.prefetch_precision)} "
                                  f"({counters.prefetch_used} of {counters.prefetch_copies})",
            "unused prefetches": str(counters.prefetch_unused),
            "PCIe": pcie_text(model, memory),
            "time stalled": f"{counters.stall_seconds * 1000:.1f} ms ({counters.stalls} stalls)",
        })


def pcie_text(model: TelemetryModel, memory: MemorySample | None) -> str:
    """NVML's measured host-to-device rate where there is one, else the engine's copies per second."""
    gpu = memory.gpu if memory is not None else None
    if gpu is not None and gpu.pcie_rx_bytes_per_s is not None:
        return f"{gpu.pcie_rx_bytes_per_s / 1e9:.2f} GB/s (NVML, host to device)"
    rate = model.engine_bytes_per_s()
    return "–" if rate is None else f"{rate / 1e9:.3f} GB/s (engine copies, this reply)"
