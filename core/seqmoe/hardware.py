"""Consumer GPUs, their host links and model shapes: the costs the simulator replays traces
with, and the setups whose copy-to-compute ratio the emulated link imitates on the CPU.

No PyTorch here: the app lists the setups in its settings without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Hardware:
    description: str
    link_bytes_per_s: float
    link_latency_s: float
    memory_bytes_per_s: float

    def copy_seconds(self, shape: ModelShape) -> float:
        """One expert's copy over the link."""
        return self.link_latency_s + shape.copy_bytes / self.link_bytes_per_s

    def layer_seconds(self, shape: ModelShape) -> float:
        """One MoE layer's decode, bound by memory bandwidth."""
        return shape.layer_bytes / self.memory_bytes_per_s

    def at_efficiency(self, share: float) -> Hardware:
        """The same GPU with decode reaching only ``share`` of its memory bandwidth (as real
        engines do at batch size 1: kernel launches and small matrices)."""
        if share == 1.0:
            return self
        description = f"{self.description}, decode at {share:.0%} of memory bandwidth"
        return replace(self, description=description, memory_bytes_per_s=self.memory_bytes_per_s * share)


@dataclass(frozen=True)
class ModelShape:
    description: str
    expert_bytes: int
    attention_bytes: int
    top_k: int
    packed_share: float = 1.0
    """The share of an expert's bytes its copy moves (below 1 with packed experts, ``compression``)."""

    @property
    def layer_bytes(self) -> int:
        return self.top_k * self.expert_bytes + self.attention_bytes

    @property
    def copy_bytes(self) -> int:
        """At least a byte: a share so small it rounds to none still copies something."""
        return max(1, round(self.expert_bytes * self.packed_share))

    def packed(self, share: float) -> ModelShape:
        """The same model with copies moving ``share`` of an expert's bytes (compute reads them all)."""
        if share == 1.0:
            return self
        return replace(self, description=f"{self.description}, copies packed to {share:.0%}", packed_share=share)


HARDWARE = {
    "rtx4090-pcie4": Hardware("RTX 4090, PCIe 4.0 x16 (24 GB/s)", 24e9, 10e-6, 1008e9),
    "rtx5090-pcie5": Hardware("RTX 5090, PCIe 5.0 x16 (48 GB/s)", 48e9, 10e-6, 1792e9),
    "rtx4060laptop-pcie4x8": Hardware("RTX 4060 Laptop, PCIe 4.0 x8 (12 GB/s)", 12e9, 10e-6, 256e9),
}
SHAPES = {
    "olmoe": ModelShape("OLMoE-1B-7B, bf16", 3 * 2048 * 1024 * 2, 4 * 2048 * 2048 * 2, 8),
    "qwen3-30b-a3b": ModelShape("Qwen3-30B-A3B, bf16", 3 * 2048 * 768 * 2, (32 + 4 + 4 + 32) * 128 * 2048 * 2, 8),
    "mixtral-8x7b": ModelShape("Mixtral-8x7B, bf16", 3 * 4096 * 14336 * 2, (32 + 8 + 8 + 32) * 128 * 4096 * 2, 2),
}


@dataclass(frozen=True)
class Setup:
    """A consumer GPU and its host link (the simulator's profiles) with a model shape."""

    hardware: Hardware
    shape: ModelShape
    source: str = ""
    """Where a figure of the setup comes from, when it is not a data-sheet value."""

    @property
    def description(self) -> str:
        memory = f"{self.hardware.memory_bytes_per_s / 1e9:.0f} GB/s memory"
        return f"{self.shape.description} on {self.hardware.description}, {memory}" + (f" ({self.source})" if self.source else "")

    @property
    def transfer_to_compute(self) -> float:
        """One expert's copy time over one MoE layer's decode time (decode bound by memory bandwidth)."""
        copy = self.shape.expert_bytes / self.hardware.link_bytes_per_s  # without latency, as the setups are quoted
        return copy / self.hardware.layer_seconds(self.shape)


SETUPS = {
    "rtx4090-pcie4-olmoe": Setup(HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"]),
    "rtx4090-pcie4-olmoe-engine": Setup(
        HARDWARE["rtx4090-pcie4"].at_efficiency(0.39),
        SHAPES["olmoe"],
        "llama.cpp's published 196 tok/s for Qwen3-30B-A3B Q4_K_M on this card",
    ),
    "rtx4060laptop-pcie4x8-olmoe": Setup(HARDWARE["rtx4060laptop-pcie4x8"], SHAPES["olmoe"]),
}
DEFAULT_SETUP = "rtx4090-pcie4-olmoe"
