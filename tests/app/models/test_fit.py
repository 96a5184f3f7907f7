"""Whether a catalog model fits: the context in the settings sizes the KV cache its budget sets aside."""

from __future__ import annotations

import json
from dataclasses import replace

from seqmoe.budget import budget_for_free_memory, kv_cache_bytes
from transformers import PretrainedConfig

from seqmoe_chat.models.catalog import catalog_path, load_catalog
from seqmoe_chat.models.fit import DeviceMemory, fit, probe_device

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


def test_without_a_budget_fits_are_judged_for_the_vram_the_engine_would_take_now(monkeypatch) -> None:
    import torch

    # 24 GiB card: another program holds 6 GiB of it, this app 2 GiB (a loaded model it would let go).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (16 * GIB, 24 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 2 * GIB)
    automatic = probe_device(None, 4096)
    assert automatic.vram_bytes == budget_for_free_memory(2 * GIB, 16 * GIB) < 18 * GIB
    assert automatic.describe().startswith(f"Test GPU: {automatic.vram_bytes / GIB:.1f} GiB of VRAM free, ")
    chosen = probe_device(20 * GIB, 4096)
    assert chosen.vram_bytes == 20 * GIB and "20.0 GiB of VRAM (the VRAM budget in Settings)" in chosen.describe()
    qwen3 = next(e for e in load_catalog() if e.repo_id == QWEN3).shape
    roomy = replace(automatic, ram_bytes=64 * GIB)  # this machine's RAM would not hold it
    assert 0 < fit(qwen3, roomy).cached_fraction < fit(qwen3, replace(roomy, vram_bytes=24 * GIB)).cached_fraction
