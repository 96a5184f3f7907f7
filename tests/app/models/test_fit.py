"""Whether a catalog model fits: the context in the settings sizes the KV cache its budget sets aside."""

from __future__ import annotations

import json
from dataclasses import replace

from seqmoe.budget import kv_cache_bytes
from transformers import PretrainedConfig

from seqmoe_chat.models.catalog import catalog_path, load_catalog
from seqmoe_chat.models.fit import DeviceMemory, fit

GIB = 2**30
QWEN3 = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def test_a_longer_context_leaves_fewer_experts_cached_as_the_engine_would_count() -> None:
    entry = next(e for e in load_catalog() if e.repo_id == QWEN3)
    device = DeviceMemory("cuda", "Test GPU", 24 * GIB, 64 * GIB, 4096)
    short, long = fit(entry.shape, device), fit(entry.shape, replace(device, context_tokens=65536))
    assert short.kind == long.kind == "offloaded" and long.cached_fraction < short.cached_fraction
    raw = next(m for m in json.loads(catalog_path().read_text())["models"] if m["id"] == QWEN3)
    assert entry.shape.kv_bytes(65536) == kv_cache_bytes(PretrainedConfig(**raw["config"]), 65536, 2)


def test_a_context_past_the_models_limit_reserves_only_the_limit() -> None:
    entry = next(e for e in load_catalog() if e.repo_id == "allenai/OLMoE-1B-7B-0924-Instruct")
    shape = replace(entry.shape, context_limit=4096)
    assert shape.kv_bytes(1 << 20) == shape.kv_bytes(4096) == 4096 * shape.kv_bytes_per_token > 0
