"""The bundled demo model: a standard transformers MoE that chats offline and offloads exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from seqmoe import Engine, Sampling, load_model
from seqmoe.cache import ExpertCache
from seqmoe.cli import main
from seqmoe.errors import BudgetTooSmall
from seqmoe.policies import SeqMoEPolicy
from seqmoe.resources import demo_model_dir
from seqmoe.store import SlotState

DEMO = demo_model_dir()


def test_demo_model_meets_the_size_and_shape_constraints() -> None:
    config = json.loads((DEMO / "config.json").read_text())
    assert "auto_map" not in config
    weights = DEMO / "model.safetensors"
    assert weights.stat().st_size <= 25 * 10**6
    with safe_open(str(weights), "pt") as handle:
        tensors = {name: handle.get_slice(name).get_shape() for name in handle.keys()}
        dtypes = {handle.get_slice(name).get_dtype() for name in handle.keys()}
    assert dtypes == {"BF16"}
    total = sum(torch.Size(shape).numel() for shape in tensors.values())
    experts = sum(torch.Size(shape).numel() for name, shape in tensors.items() if ".mlp.experts." in name)
    assert experts / total >= 0.70
    loaded = load_model(str(DEMO), device="cpu")
    assert loaded.host.num_layers >= 6
    assert loaded.host.layout.num_experts >= 16
    assert loaded.top_k >= 2


def test_loading_reports_every_layer_it_packs_and_can_stop_between_them() -> None:
    stages: list[tuple[str, float]] = []
    loaded = load_model(str(DEMO), device="cpu", on_progress=lambda stage, fraction: stages.append((stage, fraction)))
    kept = [(stage, fraction) for stage, fraction in stages if stage.startswith("Keeping the experts in host memory (")]
    assert [stage for stage, _ in kept] == [f"Keeping the experts in host memory (layer {n} of 8)" for n in range(1, 9)]
    assert [fraction for _, fraction in stages] == sorted(fraction for _, fraction in stages) and loaded.host.packed

    class Stop(Exception):
        pass

    def stop_at_layer_3(stage: str, fraction: float) -> None:
        if "(layer 3 of" in stage:
            raise Stop

    with pytest.raises(Stop):
        load_model(str(DEMO), device="cpu", on_progress=stop_at_layer_3)


def test_chat_template_marks_roles_and_ends_turns_with_eos() -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEMO)
    messages = [
        {"role": "system", "content": "You like hiking."},
        {"role": "user", "content": "Hi! What do you do for fun?"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.index("You like hiking.") < text.index("Hi! What do you do for fun?")
    assert "system" in text and "user" in text and text.rstrip().endswith("assistant")
    ids = tokenizer("Hello there, it's nice to meet you!")["input_ids"]
    assert tokenizer.decode(ids) == "Hello there, it's nice to meet you!"
    model = AutoModelForCausalLM.from_pretrained(DEMO)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    assert tokenizer.convert_tokens_to_ids(tokenizer.eos_token) in eos_ids
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**prompt, max_new_tokens=60, do_sample=False)[0, prompt["input_ids"].shape[1] :]
    assert output[-1].item() in eos_ids, "a short greedy reply ends its turn with the EOS token"
    reply = tokenizer.decode(output, skip_special_tokens=True)
    assert len(reply.split()) >= 3 and reply.strip()[0].isalpha()


@pytest.fixture(scope="module")
def demo_engine() -> Engine:
    engine = Engine(load_model(str(DEMO), device="cpu"))
    yield engine
    engine.close()


def test_offloaded_demo_generation_is_identical_to_transformers(demo_engine: Engine) -> None:
    prompt = demo_engine.encode("Hi! I just got back from a trip to the mountains. Do you like hiking?", chat=True)
    model = AutoModelForCausalLM.from_pretrained(DEMO)
    inputs = torch.tensor([prompt])
    expected = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=24, do_sample=False)
    expected = expected[0, len(prompt) :].tolist()
    minimum = demo_engine.geometry.minimum_slots / demo_engine.geometry.total_experts
    for ratio in (1.0, 0.45, minimum):
        demo_engine.configure("lru", cache_ratio=ratio)
        assert demo_engine.generate(prompt, Sampling(max_new_tokens=24)).token_ids == expected, ratio


def test_generate_without_model_chats_with_the_demo_offline(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "--chat", "--prompt", "Hello! How are you today?", "--max-new-tokens", "20",
                   "--cache-ratio", "0.45", "--device", "cpu", "--json"])
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"].strip() and result["stats"]["policy"] == "seqmoe"  # the app's default too
    assert result["stats"]["cache_ratio"] == pytest.approx(0.45, abs=0.01)
    assert (result["stats"]["link_setup"], result["stats"]["link_gbps"]) == (None, 25.0)
    assert 0.74 < result["stats"]["bytes_per_copy"] / (3 * 192 * 96 * 2) < 0.76  # the demo's bf16 experts, packed


def test_generate_can_match_the_emulated_link_to_a_setup_as_the_app_does(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--prompt", "Hello!", "--max-new-tokens", "4", "--device", "cpu", "--json",
            "--setup", "rtx4060laptop-pcie4x8-olmoe"]
    assert main(args) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    # A demo expert over a link matched to a few of the demo's layers of decode: far below the default 25 GB/s.
    assert stats["link_setup"] == "rtx4060laptop-pcie4x8-olmoe" and stats["link_gbps"] < 1.0
    assert main([*args, "--link-gbps", "3"]) == 2
    assert "give --setup or --link-gbps, not both" in capsys.readouterr().err


def test_seqmoe_starts_with_the_predictors_likeliest_experts_so_a_first_prompt_copies_fewer(
    demo_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = demo_engine.encode("Do you like hiking in the mountains?", chat=True)
    greedy = Sampling(max_new_tokens=8)
    demo_engine.configure("seqmoe", cache_ratio=0.45)
    pool = demo_engine.cache.pool
    prior = demo_engine.predictor().config.prior()
    held = torch.zeros_like(prior, dtype=torch.bool)
    for layer, expert in demo_engine.cached_experts:
        held[layer, expert] = True
    assert int(held.sum()) == pool.size and all(pool.state(slot) is SlotState.READY for slot in range(pool.size))
    assert prior[held].min() >= prior[~held].max()  # the likeliest by the routing frequencies it was trained on
    warm = demo_engine.generate(prompt, greedy)
    monkeypatch.setattr(SeqMoEPolicy, "warm_order", lambda self, slots: [])
    demo_engine.configure("seqmoe", cache_ratio=0.45)
    assert demo_engine.cached_experts == []
    cold = demo_engine.generate(prompt, greedy)
    assert warm.token_ids == cold.token_ids
    assert warm.stats.prefill_h2d_bytes < 0.8 * cold.stats.prefill_h2d_bytes


def test_running_out_of_memory_filling_a_resized_cache_says_to_choose_a_smaller_budget(
    demo_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo_engine.configure("seqmoe", cache_ratio=0.3)

    def out_of_memory(self) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(ExpertCache, "warm", out_of_memory)
    with pytest.raises(BudgetTooSmall, match="ran out of memory filling the .* expert slots; choose a smaller VRAM budget"):
        demo_engine.resize(cache_ratio=0.6)
