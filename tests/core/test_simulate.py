"""The trace-driven simulator agrees with the emulated runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqmoe import Engine, Sampling, load_model
from seqmoe.simulate import HARDWARE, SHAPES, simulate
from seqmoe.trace import Document, RoutingRecorder, Traces, trace_document

PROMPT = [5, 17, 42, 99, 23, 64, 7, 88, 31, 12, 56, 77]
NEW_TOKENS = 16


@pytest.mark.parametrize("ratio", [0.35, 0.6])
def test_simulator_and_emulated_runtime_agree_on_lru_hit_rate(tiny_models: dict[str, Path], ratio: float) -> None:
    engine = Engine(load_model(str(tiny_models["olmoe"]), device="cpu"))
    engine.configure("lru", cache_ratio=ratio)
    stats = engine.generate(PROMPT, Sampling(max_new_tokens=NEW_TOKENS)).stats
    # generate runs one forward pass per new token but the last; the trace records the same passes.
    recorder = RoutingRecorder(engine.loaded)
    record = trace_document(engine.loaded, recorder, Document(PROMPT, continuation=stats.tokens - 1))
    recorder.close()
    engine.close()
    record["document"] = record["decode"].int() * 0
    traces = Traces(manifest={}, **record)
    result = simulate(traces, "lru", ratio, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    assert result.decode_tokens == stats.tokens - 1
    assert (result.hits, result.misses) == (stats.decode_hits, stats.decode_misses)
    assert result.hits > 0 and result.misses > 0
