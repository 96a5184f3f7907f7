"""The few numbers that decide whether a model fits a computer, from a catalog entry or from
a model's config checked by the engine's loader (before any weight is downloaded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine_import import import_engine

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

@dataclass(frozen=True)
class ModelShape:
    parameters_total: int
    moe_layers: int
    experts_per_layer: int
    top_k: int
    bytes_per_expert: int  # as the engine holds an expert (a quantized checkpoint is dequantized on load)
    dtype_bytes: int
    kv_bytes_per_token: int
    context_limit: int | None  # the model's own, when its config says

    def kv_bytes(self, context_tokens: int) -> int:
        """The KV-cache reserve the engine makes in a VRAM budget for a context of ``context_tokens``."""
        import_engine()
        from seqmoe.budget import context_held

        return self.kv_bytes_per_token * context_held(context_tokens, self.context_limit)

    @property
    def total_experts(self) -> int:
        return self.moe_layers * self.experts_per_layer

    @property
    def expert_bytes(self) -> int:
        return self.total_experts * self.bytes_per_expert

    @property
    def total_bytes(self) -> int:
        return self.parameters_total * self.dtype_bytes

    @property
    def resident_bytes(self) -> int:
        """Everything but the routed experts: it stays on the device."""
        return self.total_bytes - self.expert_bytes

    @property
    def parameters_active(self) -> int:
        """Parameters one token uses: all but the experts the router did not choose."""
        unused = self.moe_layers * (self.experts_per_layer - self.top_k) * self.bytes_per_expert // self.dtype_bytes
        return self.parameters_total - unused


def kv_bytes_per_token(config: PretrainedConfig, dtype_bytes: int) -> int:
    import_engine()
    from seqmoe.budget import kv_cache_bytes

    return kv_cache_bytes(config, 1, dtype_bytes)


def shape_of_catalog_entry(entry: dict[str, Any]) -> ModelShape:
    """From a catalog entry: its figures, and the attention fields of its config for the KV reserve."""
    import_engine()
    from seqmoe.loader import context_limit
    from transformers import PretrainedConfig

    dtype_bytes = int(entry["dtype_bytes"])
    config = PretrainedConfig(**entry["config"])
    return ModelShape(
        parameters_total=int(entry["parameters_total"]),
        moe_layers=int(entry["moe_layers"]),
        experts_per_layer=int(entry["experts_per_layer"]),
        top_k=int(entry["top_k"]),
        bytes_per_expert=int(entry["bytes_per_expert"]),
        dtype_bytes=dtype_bytes,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype_bytes),
        context_limit=context_limit(config),
    )


def shape_of_skeleton(config: PretrainedConfig, skeleton: nn.Module) -> ModelShape:
    """From the meta-device model that ``seqmoe.loader.check_supported`` returns."""
    import_engine()
    from seqmoe.loader import context_limit, find_experts, top_k_of
    from seqmoe.store import expert_parameters

    experts = find_experts(skeleton)
    tensors = list(expert_parameters(experts[0]).values())
    dtype_bytes = tensors[0].element_size()
    return ModelShape(
        parameters_total=sum(p.numel() for p in skeleton.parameters()),
        moe_layers=len(experts),
        experts_per_layer=tensors[0].shape[0],
        top_k=top_k_of(config),
        bytes_per_expert=sum(t[0].numel() * t.element_size() for t in tensors),
        dtype_bytes=dtype_bytes,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype_bytes),
        context_limit=context_limit(config),
    )
