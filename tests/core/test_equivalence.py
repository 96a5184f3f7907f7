"""Offloaded generation gives exactly the tokens of transformers' own generate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, CompileConfig, Mxfp4Config, PreTrainedModel
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from seqmoe import Engine, Sampling, load_model
from seqmoe import experts as experts_impl
from seqmoe.budget import kv_cache_bytes
from seqmoe.cli import main
from seqmoe.events import LayerRouted

from .conftest import EOS, FAMILIES, VOCAB, build_model, layers_that_differ, store_experts_as_mxfp4

PROMPT = [5, 17, 42, 99, 23, 64, 7, 88, 31, 12, 56, 77]
NEW_TOKENS = 12


def reference_tokens(folder: Path, sampling: Sampling, device: str = "cpu", **options: object) -> list[int]:
    # Moved, not placed with ``device_map``: that needs accelerate, which the project does not depend on.
    model = AutoModelForCausalLM.from_pretrained(folder, **options).to(device)
    inputs = torch.tensor([PROMPT], device=device)
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    output = model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=sampling.max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=None if sampling.greedy else sampling.temperature,
        top_p=None if sampling.greedy else sampling.top_p,
        top_k=None,
        pad_token_id=0,
    )
    return output[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_output_matches_reference_at_every_cache_size(tiny_models: dict[str, Path], family: str) -> None:
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    expected = reference_tokens(tiny_models[family], greedy)
    engine = Engine(load_model(str(tiny_models[family]), device="cpu"))
    minimum = engine.geometry.minimum_slots / engine.geometry.total_experts
    try:
        for policy, ratio in [("full", 1.0), ("lru", 1.0), ("lru", 0.5), ("lru", minimum)]:
            engine.configure(policy, cache_ratio=ratio)
            result = engine.generate(PROMPT, greedy)
            assert result.token_ids == expected, f"{family} {policy} at cache ratio {ratio:.2f}"
            assert result.stats.cache_slots == round(ratio * engine.geometry.total_experts)
    finally:
        engine.close()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_bfloat16_experts_give_the_reference_tokens(tiny_models: dict[str, Path], family: str) -> None:
    """bfloat16 experts cross the link packed (``compression``) and are unpacked bit for bit."""
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    expected = reference_tokens(tiny_models[family], greedy, dtype=torch.bfloat16)
    engine = Engine(load_model(str(tiny_models[family]), device="cpu", dtype="bfloat16"))
    host = engine.loaded.host
    minimum = engine.geometry.minimum_slots / engine.geometry.total_experts
    try:
        assert host.packed
        for policy, ratio in [("full", 1.0), ("lru", minimum), ("seqmoe", 0.5)]:
            engine.configure(policy, cache_ratio=ratio)
            result = engine.generate(PROMPT, greedy)
            assert result.token_ids == expected, f"{family} {policy} at cache ratio {ratio:.2f}"
            if policy == "lru":
                assert 0 < result.stats.h2d_bytes < 0.8 * result.stats.misses * host.layout.bytes_per_expert
    finally:
        engine.close()


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
def test_seeded_sampling_matches_reference(tiny_models: dict[str, Path], family: str) -> None:
    sampling = Sampling(max_new_tokens=NEW_TOKENS, greedy=False, temperature=1.3, top_p=0.9, seed=1234)
    expected = reference_tokens(tiny_models[family], sampling)
    engine = Engine(load_model(str(tiny_models[family]), device="cpu"))
    engine.configure("lru", cache_ratio=0.5)
    try:
        assert engine.generate(PROMPT, sampling).token_ids == expected
    finally:
        engine.close()


def test_small_cache_really_offloads(mixtral_dir: Path) -> None:
    """At the minimum size the cache must evict and reload: misses and copies are counted."""
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("lru", cache_ratio=engine.geometry.minimum_slots / engine.geometry.total_experts)
    try:
        stats = engine.generate(PROMPT, Sampling(max_new_tokens=6)).stats
    finally:
        engine.close()
    expert = engine.loaded.host.layout.bytes_per_expert
    assert stats.misses > 0 and stats.h2d_bytes == stats.misses * expert
    assert (stats.prefill_h2d_bytes, stats.decode_h2d_bytes) == (stats.prefill_misses * expert, stats.decode_misses * expert)
    assert stats.hit_rate < 1.0


@pytest.mark.parametrize("policy", ["lru", "seqmoe"])
def test_a_one_token_prompt_is_prefill(mixtral_dir: Path, capsys: pytest.CaptureFixture[str], policy: str) -> None:
    """The phase comes from the engine, not from the number of tokens a layer sees."""
    status = main(["generate", "--model", str(mixtral_dir), "--device", "cpu", "--prompt", "H", "--max-new-tokens", "1",
                   "--json", "--policy", policy, "--cache-ratio", "0.3"])
    reply = json.loads(capsys.readouterr().out)
    stats = reply["stats"]
    assert status == 0 and reply["prompt_tokens"] == 1
    assert stats["prefill_misses"] > 0 and stats["decode_hits"] + stats["decode_misses"] == 0
    assert stats["decode_h2d_bytes"] == 0


def test_prefill_and_decode_copies_add_up_to_what_the_link_carried(mixtral_dir: Path) -> None:
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("seqmoe", cache_ratio=0.5)
    try:
        stats = engine.generate(PROMPT, Sampling(max_new_tokens=8)).stats
    finally:
        engine.close()
    assert stats.prefill_h2d_bytes > 0 and stats.decode_h2d_bytes > 0
    assert stats.prefill_h2d_bytes + stats.decode_h2d_bytes == stats.h2d_bytes


def test_full_policy_copies_nothing_and_hits_always(mixtral_dir: Path) -> None:
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("full")
    try:
        stats = engine.generate(PROMPT, Sampling(max_new_tokens=4)).stats
    finally:
        engine.close()
    assert stats.misses == 0 and stats.h2d_bytes == 0 and stats.hits > 0
    assert stats.hit_rate == 1.0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_predictive_policies_give_the_reference_tokens(tiny_models: dict[str, Path], family: str) -> None:
    from seqmoe.bench import future_of, record_accesses

    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    expected = reference_tokens(tiny_models[family], greedy)
    # A link slow enough that looking ahead pays: on a fast one ``seqmoe`` rightly spends nothing on it.
    engine = Engine(load_model(str(tiny_models[family]), device="cpu"), link_gbps=0.02)
    minimum = engine.geometry.minimum_slots / engine.geometry.total_experts
    try:
        for ratio in (0.5, minimum):
            future = future_of(record_accesses(engine, PROMPT, greedy, ratio))
            for policy in ("gate", "seqmoe", "oracle", "oracle-next"):
                engine.configure(policy, cache_ratio=ratio, future=future if policy.startswith("oracle") else None)
                result = engine.generate(PROMPT, greedy)
                assert result.token_ids == expected, f"{family} {policy} at cache ratio {ratio:.2f}"
                if ratio == 0.5 and policy != "seqmoe":
                    # Prefetching ran, unless decode found everything resident: prefill streams on
                    # the emulated link, so what it leaves behind depends on timing. ``seqmoe``
                    # weighs each copy against the layer times measured in this run, and on random
                    # weights its forecasts are rarely sure enough for a copy that would be late:
                    # whether it copies at all depends on the machine's timing.
                    stats = result.stats
                    assert stats.prefetch_issued > 0 or stats.decode_misses == 0, policy
    finally:
        engine.close()


def test_an_mxfp4_checkpoint_runs_dequantized(tmp_path: Path) -> None:
    """gpt-oss ships MXFP4 experts: they are dequantized on load (no accelerate or kernels
    needed) and offloaded like any others, with transformers' own dequantized model's tokens."""
    folder = store_experts_as_mxfp4(build_model(tmp_path / "gpt-oss-mxfp4", FAMILIES["gpt_oss"]))
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    expected = reference_tokens(folder, greedy, quantization_config=Mxfp4Config(dequantize=True))
    engine = Engine(load_model(str(folder), device="cpu"))
    try:
        assert not engine.loaded.config.to_dict().get("quantization_config")
        for policy in ("lru", "gate"):
            engine.configure(policy, cache_ratio=0.5)
            assert engine.generate(PROMPT, greedy).token_ids == expected, policy
    finally:
        engine.close()


def test_a_model_whose_layers_differ_runs_and_reserves_each_layers_keys(tmp_path: Path) -> None:
    """transformers' per-layer configs (here fewer attention heads in some layers) make the
    model-wide head count unreadable; the engine sizes the KV reserve layer by layer."""
    folder = build_model(tmp_path / "dots3", layers_that_differ())
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    expected = reference_tokens(folder, greedy)
    engine = Engine(load_model(str(folder), device="cpu"))
    try:
        for policy in ("lru", "seqmoe"):
            engine.configure(policy, cache_ratio=0.5)
            assert engine.generate(PROMPT, greedy).token_ids == expected, policy
    finally:
        engine.close()
    # Two of the three layers keep half the heads' keys and values.
    assert 3 * kv_cache_bytes(layers_that_differ(), 100, 2) == 2 * kv_cache_bytes(layers_that_differ(None), 100, 2)


class _ReportedCuda(str):
    """A model's device as transformers' decode switch sees it (``cuda``) that tensors still move
    to as ``cpu``: the switch, without a GPU."""

    type = "cuda"


def test_decode_steps_run_the_kernel_transformers_switches_to_off_the_cpu(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, bool]] = []
    for name in ("grouped_mm", "batched_mm"):
        kernel = ALL_EXPERTS_FUNCTIONS[name]
        monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS, name, lambda module, hidden, index, weights, kernel=kernel, name=name: (
            calls.append((name, hidden.shape[0] > 1)) or kernel(module, hidden, index, weights)))
    monkeypatch.setattr(PreTrainedModel, "device", property(lambda model: _ReportedCuda("cpu")))
    greedy = Sampling(max_new_tokens=4)
    expected = reference_tokens(tiny_models["qwen3_moe"], greedy)
    seen_by_transformers, calls[:] = set(calls), []
    assert seen_by_transformers == {("grouped_mm", True), ("batched_mm", False)}
    engine = Engine(load_model(str(tiny_models["qwen3_moe"]), device="cpu"))
    try:
        for policy in ("full", "lru"):
            engine.configure(policy)
            assert engine.generate(PROMPT, greedy).token_ids == expected
            assert set(calls) == seen_by_transformers, policy
            calls.clear()
    finally:
        engine.close()


@pytest.mark.parametrize("small", [True, False])
def test_on_the_cpu_a_small_models_decode_steps_run_on_one_thread(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if not small:
        monkeypatch.setattr(experts_impl, "SMALL_EXPERT_BYTES", 0)
    threads = max(torch.get_num_threads(), 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # as on a machine with cores to share
    asked: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    engine = Engine(load_model(str(tiny_models["qwen3_moe"]), device="cpu"))
    seen: list[tuple[bool, list[int]]] = []
    engine.loaded.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (kwargs["input_ids"].shape[1] > 1, list(asked))), with_kwargs=True)
    try:
        for policy, ratio in (("full", 1.0), ("lru", 0.5)):
            engine.configure(policy, cache_ratio=ratio)
            seen.clear()
            asked.clear()
            engine.generate(PROMPT, Sampling(max_new_tokens=4))
            assert seen[0] == (True, [])  # prefill on every thread
            assert all(not prefill for prefill, _ in seen[1:]) and len(seen) == 4
            assert asked == ([1, threads] if small else []), policy  # one thread while decoding, then all again
            assert all(during == ([1] if small else []) for _, during in seen[1:])
    finally:
        engine.close()


def test_a_model_asking_for_a_compiled_static_cache_is_run_as_it_is_not_compiled(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers compiles the forward pass (CUDA graphs on a GPU) when the cache a model's
    generation_config asks for can be compiled: a forward that chooses and copies experts on the
    host at every layer must run as it is written."""
    greedy = Sampling(max_new_tokens=6)
    expected = reference_tokens(tiny_models["qwen3_moe"], greedy)
    engine = Engine(load_model(str(tiny_models["qwen3_moe"]), device="cpu"))
    model = engine.loaded.model
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = CompileConfig()
    model.generation_config.compile_config._compile_all_devices = True  # as on a GPU, here on the CPU

    def compiled(*_: object) -> None:
        raise AssertionError("the forward pass was compiled")

    monkeypatch.setattr(model, "get_compiled_call", compiled)
    try:
        for policy in ("full", "seqmoe"):
            engine.configure(policy, cache_ratio=None if policy == "full" else 0.5)
            assert engine.generate(PROMPT, greedy).token_ids == expected, policy
    finally:
        engine.close()


@pytest.mark.parametrize("asks_for", [{"num_beams": 2}, {"prompt_lookup_num_tokens": 3}])
def test_a_generation_config_asking_for_another_decoding_still_gets_one_token_a_step(
    tiny_models: dict[str, Path], tmp_path: Path, asks_for: dict
) -> None:
    """Beam search (which cannot stream) and prompt-lookup decoding (several tokens a step, each
    step a small prefill to the cache): what a model's generation_config.json may ask for."""
    greedy = Sampling(max_new_tokens=6)
    folder = shutil.copytree(tiny_models["qwen3_moe"], tmp_path / "model")
    expected = reference_tokens(folder, greedy)
    config = folder / "generation_config.json"
    stored = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**stored, **asks_for}))
    engine = Engine(load_model(str(folder), device="cpu"))
    prefill_layers: list[int] = []
    engine.events.subscribe(lambda e: prefill_layers.append(e.layer) if isinstance(e, LayerRouted) and e.prefill else None)
    try:
        tokens: list[int] = []
        assert engine.generate(PROMPT, greedy, on_token=tokens.append).token_ids == expected == tokens
    finally:
        engine.close()
    assert prefill_layers == list(range(engine.loaded.host.num_layers))  # the prompt's pass only


def test_a_text_model_whose_causal_lm_transformers_files_under_another_task_runs(tmp_path: Path) -> None:
    # Mistral 4's Mistral4ForCausalLM is listed under image-text-to-text only: the model was
    # refused as "an image-and-text model, ... no ...ForCausalLM class".
    config = transformers.Mistral4Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=256, pad_token_id=0, eos_token_id=EOS,
    )
    build_model(tmp_path, config, make=transformers.Mistral4ForCausalLM)
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    inputs = torch.tensor([PROMPT])
    expected = transformers.Mistral4ForCausalLM.from_pretrained(tmp_path).generate(
        inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
    )[0, len(PROMPT):].tolist()
    engine = Engine(load_model(str(tmp_path), device="cpu"))
    try:
        for policy, ratio in [("full", 1.0), ("lru", 0.5), ("seqmoe", 0.3)]:
            engine.configure(policy, cache_ratio=ratio)
            assert engine.generate(PROMPT, greedy).token_ids == expected, f"{policy} at cache ratio {ratio}"
    finally:
        engine.close()
