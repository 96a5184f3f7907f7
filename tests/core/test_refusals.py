"""Every model the engine cannot run is refused with one line and exit status 2."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import seqmoe.cli
import seqmoe.loader
from seqmoe import ModelRefused, load_model
from seqmoe.cli import main

from .conftest import build_model


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["generate", "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_refused(capsys: pytest.CaptureFixture[str], model: str | Path, *words: str, extra: tuple[str, ...] = ()) -> None:
    status, out, err = run_cli(capsys, "--model", str(model), *extra)
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seqmoe: error: "), err
    for word in words:
        assert word in lines[0], lines[0]


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_missing_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_refused(capsys, tmp_path / "nowhere", "no such model folder")


def test_hub_id_offline(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(capsys, "seqmoe-tests/not-a-real-model", "offline")


def test_folder_without_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_refused(capsys, tmp_path, "no config.json")


def test_dense_model_is_not_an_moe(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    folder = build_model(tmp_path / "llama", config)
    assert_refused(capsys, folder, "LlamaForCausalLM", "not a Mixture-of-Experts")


@pytest.mark.parametrize(
    ("config", "architecture"),
    [
        (transformers.JetMoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, kv_channels=8,
                                   num_local_experts=4, num_experts_per_tok=2), "JetMoeForCausalLM"),
        # the expert count in a nested config
        (transformers.DbrxConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=128, attn_config={"kv_n_heads": 2, "rope_theta": 10000.0},
                                 ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2}),
         "DbrxForCausalLM"),
    ],
)
def test_moe_outside_the_experts_interface_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: transformers.PretrainedConfig, architecture: str
) -> None:
    folder = build_model(tmp_path / config.model_type, config)
    assert_refused(capsys, folder, architecture, "experts interface")


@pytest.mark.parametrize(
    ("config", "kind"),
    [(transformers.Qwen3VLMoeConfig(), "image-and-text model"), (transformers.SwitchTransformersConfig(), "encoder-decoder")],
)
def test_an_moe_that_is_no_causal_lm_says_what_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: transformers.PretrainedConfig, kind: str
) -> None:
    config.save_pretrained(tmp_path)
    assert_refused(capsys, tmp_path, repr(config.model_type), kind, "not a text-only causal language model")


def test_a_config_transformers_cannot_build_is_refused_with_its_error(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "bad-activation")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "no-such-activation"}))
    assert_refused(capsys, folder, "cannot build a 'mixtral' model from this config.json", "no-such-activation")


def test_a_config_value_of_the_wrong_type_is_named(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "typo")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": "abc"}))
    assert_refused(capsys, folder, "config.json has a value transformers refuses", "'hidden_size'", "expected int")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_file_that_cannot_be_read_is_named(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "locked")
    real_open = Path.open

    def locked(self: Path, *args: object, **kwargs: object):  # as chmod 000 is for anyone but root
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", locked)
    assert_refused(capsys, folder, name, "cannot be read: Permission denied")


def test_remote_code_is_refused_and_never_run(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "remote")
    marker = tmp_path / "remote-code-ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}
    config["model_type"] = "evil_moe"
    (folder / "config.json").write_text(json.dumps(config))
    assert_refused(capsys, folder, "remote code", "auto_map")
    assert not marker.exists()


def test_shipped_code_for_a_built_in_architecture_is_ignored(mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "native")
    marker = tmp_path / "remote-code-ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_model(str(folder), device="cpu")
    assert type(loaded.model).__name__ == "MixtralForCausalLM"
    assert not marker.exists()


def test_a_quantization_it_cannot_undo_is_refused_before_the_weights(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "fp8")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").unlink()  # refused from the config alone, as before a download
    assert_refused(capsys, folder, "fp8-quantized", "bf16 release")


def test_missing_weights(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "noweights")
    (folder / "model.safetensors").unlink()
    assert_refused(capsys, folder, "no weight files")


# The files keep Mixtral's per-expert weights (experts.0.w1, ...), which transformers fuses as it
# loads them: a change of their size is found once loaded, the others before any weight is read.
@pytest.mark.parametrize("key, before_reading", [("intermediate_size", False), ("hidden_size", True), ("vocab_size", True)])
def test_weights_of_other_shapes_than_the_config_are_named(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    key: str, before_reading: bool,
) -> None:
    # transformers' own error only pointed at a report it logged, which the app's user never sees.
    folder = copy_model(mixtral_dir, tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    config[key] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    if before_reading:
        monkeypatch.setattr(seqmoe.loader.AutoModelForCausalLM, "from_pretrained", None)
    assert_refused(capsys, folder, "weights of edited do not have the shapes its config.json gives", "in the checkpoint",
                   "from the config")


# transformers stacks the experts it finds: a gap read as a tensor of another size (Qwen3-MoE's
# experts.3.down_proj) or as a failed conversion (Mixtral's experts.3.w1), not as a missing weight.
@pytest.mark.parametrize("family, key", [("qwen3_moe", "model.layers.1.mlp.experts.3.down_proj.weight"),
                                         ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w1.weight")])
def test_a_missing_expert_weight_is_named_before_any_weight_is_read(
    capsys: pytest.CaptureFixture[str], tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    family: str, key: str,
) -> None:
    folder = copy_model(tiny_models[family], tmp_path / "gap")
    weights = load_file(str(folder / "model.safetensors"))
    del weights[key]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(seqmoe.loader.AutoModelForCausalLM, "from_pretrained", None)
    status, _, err = run_cli(capsys, "--model", str(folder))
    assert status == 2 and err == f"seqmoe: error: the checkpoint of gap lacks {key}\n"


def test_missing_shard_of_an_index(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "sharded")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(capsys, folder, "model-00002-of-00002.safetensors", "missing")


def test_truncated_weights(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "truncated")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    assert_refused(capsys, folder, "truncated")


def test_missing_tokenizer(capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "notokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    assert_refused(capsys, folder, "tokenizer")


def test_a_model_whose_tokenizer_would_build_empty_without_its_files(
    capsys: pytest.CaptureFixture[str], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    folder = copy_model(tiny_models["qwen3_moe"], tmp_path / "notokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    assert_refused(capsys, folder, "no usable tokenizer", "it encodes no text")


def _header(header: object, data: bytes = b"") -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


@pytest.mark.parametrize(("damage", "words"), [
    ({"config.json": b"[1, 2]"}, ("not a model config",)),
    ({"model.safetensors.index.json": b"{}"}, ("model.safetensors.index.json", "damaged")),
    ({"model.safetensors.index.json": b'{"weight_map": {"a": 5, "b": "x.safetensors"}}'}, ("model.safetensors.index.json", "damaged")),
    ({"model.safetensors.index.json": b'{"weight_map": {"a": ["x.safetensors"]}}'}, ("model.safetensors.index.json", "damaged")),
    ({"model.safetensors.index.json": b"[" * 100_000 + b"]" * 100_000}, ("model.safetensors.index.json", "damaged")),
    ({"model.safetensors": _header([1, 2])}, ("model.safetensors has a corrupt header",)),
    ({"model.safetensors": _header({"w": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}}, b"abcd")},
     ("model.safetensors has a corrupt header",)),
    ({"model.safetensors": _header({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"abcd" * 3)},
     ("loading the weights", "failed")),  # bytes beyond what the header covers: safetensors' own check
])
def test_damaged_files_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, damage: dict[str, bytes], words: tuple[str, ...]
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "damaged")
    for name, content in damage.items():
        (folder / name).write_bytes(content)
    assert_refused(capsys, folder, *words)


def test_a_budget_that_is_no_number_is_refused(capsys: pytest.CaptureFixture[str], mixtral_dir: Path) -> None:
    assert_refused(capsys, mixtral_dir, "the VRAM budget must be a number of GB, got inf", extra=("--vram-budget", "inf"))


def test_budget_below_minimum(capsys: pytest.CaptureFixture[str], mixtral_dir: Path) -> None:
    assert_refused(capsys, mixtral_dir, "minimum of 3", "a cache ratio of at least 0.11", extra=("--cache-ratio", "0.05"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_the_cuda_gpu_asked_for_without_one_names_the_fix(capsys: pytest.CaptureFixture[str], mixtral_dir: Path) -> None:
    fix = "install PyTorch's CUDA build" if torch.version.cuda is None else "check the driver"
    assert_refused(capsys, mixtral_dir, "the CUDA GPU was asked for", fix, extra=("--device", "cuda"))


def test_vram_budget_below_resident_weights(capsys: pytest.CaptureFixture[str], mixtral_dir: Path) -> None:
    assert_refused(capsys, mixtral_dir, "budget of 0.01 GiB", extra=("--vram-budget", "0.01"))


@pytest.mark.parametrize(("flags", "words"), [
    (("--max-new-tokens", "0"), "at least one new token"),
    (("--temperature", "-1"), "temperature must be above 0"),
    (("--temperature", "1", "--top-p", "0"), "top-p"),
    (("--link-gbps", "0"), "speed above 0 GB/s"),
    (("--link-latency-us", "-5"), "latency of at least 0"),
    (("--link-gbps", "1e-300"), "from 0.0001 to 1e+06"),  # a copy's end was past the clock: an OverflowError
    (("--link-latency-us", "1e300"), "at most 1e+06"),
    (("--prompt", ""), "prompt is empty"),
    (("--prompt", "a" * 300), "the context holds 256 (the model's limit)"),
    (("--prompt", "a" * 20, "--context", "16"), "the context holds 16 (as set"),
])
def test_generation_settings_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, flags: tuple[str, ...], words: str
) -> None:
    assert_refused(capsys, mixtral_dir, words, extra=flags)


@pytest.mark.parametrize("argv", [
    ["train-predictor", "--traces", "t", "--out", "p.safetensors", "--epochs", "0"],
    ["train-predictor", "--traces", "t", "--out", "p.safetensors", "--horizon", "0"],
    ["train-predictor", "--traces", "t", "--out", "p.safetensors", "--width", "0"],
    ["calibrate", "--epochs", "0"],
    ["eval-predictor", "--text", "t.txt", "--horizon", "0"],
    ["trace", "--text", "t.txt", "--out", "t", "--max-tokens", "0"],
    ["trace", "--text", "t.txt", "--out", "t", "--continuation", "-1"],
    ["generate", "--prompt", "hi", "--context", "1"],
])
def test_counts_below_their_least_are_refused_by_name(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    flag = argv[-2]
    assert exited.value.code == 2 and f"argument {flag}: a" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["train-predictor", "--traces", "t", "--out", "p.safetensors", "--width", "100000000"],
    ["train-predictor", "--traces", "t", "--out", "p.safetensors", "--horizon", "1000000"],
])
def test_a_predictor_too_large_to_make_is_refused_by_name(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    # It used to end in a traceback from the allocator (a width of 10**8 asked for 77 GB).
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and f"argument {argv[-2]}: a whole number" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "hi", "--model", ""],
    ["simulate", "--traces", " "],
    ["trace", "--text", "t.txt", "--out", ""],
    ["eval-predictor", "--text", "t.txt", "--predictor", ""],
])
def test_an_empty_name_is_refused_not_read_as_the_default_or_this_folder(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and f"argument {argv[-2]}: give a name, not an empty string" in capsys.readouterr().err


def test_a_reply_stops_where_the_context_is_full_with_the_same_tokens(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path
) -> None:
    status, out, _ = run_cli(capsys, "--model", str(mixtral_dir), "--max-new-tokens", "12", "--json")
    assert status == 0
    free = json.loads(out)
    context = free["prompt_tokens"] + 5
    status, out, _ = run_cli(capsys, "--model", str(mixtral_dir), "--max-new-tokens", "12", "--json", "--context", str(context))
    assert status == 0
    cut = json.loads(out)
    assert len(free["token_ids"]) == 12 and not free["stats"]["context_full"]
    assert cut["token_ids"] == free["token_ids"][:5] and cut["stats"]["context_full"]
    status, _, err = run_cli(capsys, "--model", str(mixtral_dir), "--max-new-tokens", "12", "--context", str(context))
    assert status == 0 and f"stopped where the {context}-token context was full" in err


def test_the_context_is_capped_at_the_model_limit_and_sizes_the_kv_reserve(mixtral_dir: Path) -> None:
    from seqmoe import Engine

    loaded = load_model(str(mixtral_dir), device="cpu")
    wide, narrow = Engine(loaded, context_tokens=10**6), Engine(loaded, context_tokens=64)
    assert wide.context_tokens == loaded.context_limit == 256 and narrow.context_tokens == 64
    assert wide.geometry.kv_bytes == 4 * narrow.geometry.kv_bytes > 0


def test_temperature_zero_is_greedy(capsys: pytest.CaptureFixture[str], mixtral_dir: Path) -> None:
    replies = []
    for flags in ((), ("--temperature", "0", "--seed", "3"), ("--temperature", "2", "--seed", "3")):
        status, out, _ = run_cli(capsys, "--model", str(mixtral_dir), "--max-new-tokens", "12", "--json", *flags)
        assert status == 0
        replies.append(json.loads(out)["token_ids"])
    greedy, zero, hot = replies
    assert zero == greedy and hot != greedy


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "seqmoe", "generate", "--model", str(tmp_path / "absent"), "--prompt", "hi"],
        capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"seqmoe: error: no such model folder: {tmp_path / 'absent'}"]


def test_ctrl_c_ends_a_command_in_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(seqmoe.cli.COMMANDS, "generate", interrupted)
    assert main(["generate", "--prompt", "hi"]) == 130  # 128 + SIGINT, as shells report it
    assert capsys.readouterr().err == "seqmoe: interrupted\n"


def test_a_failure_in_the_models_own_code_is_one_line_and_the_engine_stays_usable(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqmoe import Engine, ModelCodeFailed, Sampling

    attention = transformers.models.mixtral.modeling_mixtral.MixtralAttention
    working = attention.forward
    calls = {"left": 0}

    def broken(*args: object, **kwargs: object) -> object:
        calls["left"] -= 1
        if calls["left"] < 0:
            raise ValueError("this attention cannot run on such a cache\nsecond line")
        return working(*args, **kwargs)

    greedy = Sampling(max_new_tokens=8)
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    expected = engine.generate([5, 6, 7], greedy).token_ids
    engine.configure("seqmoe", cache_ratio=0.5)
    with monkeypatch.context() as patch:
        patch.setattr(attention, "forward", broken)
        assert_refused(capsys, mixtral_dir, "MixtralForCausalLM's code in transformers", transformers.__version__,
                       "ValueError: this attention cannot run on such a cache")
        calls["left"] = 3 * len(engine.loaded.experts)  # prefill and two decode steps, then it fails
        with pytest.raises(ModelCodeFailed):
            engine.generate([5, 6, 7], greedy)
    assert engine.generate([5, 6, 7], greedy).token_ids == expected
    engine.close()


def test_a_failure_in_the_engines_own_code_is_not_blamed_on_the_model(
    mixtral_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqmoe import Engine, Sampling
    from seqmoe.cache import ExpertCache

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the cache")

    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("lru", cache_ratio=0.5)
    monkeypatch.setattr(ExpertCache, "acquire", broken)
    with pytest.raises(RuntimeError, match="a bug in the cache"):
        engine.generate([5, 6, 7], Sampling(max_new_tokens=4))
    engine.close()


def test_host_memory_that_cannot_be_pinned_is_refused_in_one_line(mixtral_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pinning happens on CUDA only; what the driver says when it cannot lock that much RAM.
    def pin(experts: object, pin: bool, on_layer: object = None) -> None:
        raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")

    monkeypatch.setattr(seqmoe.loader, "HostStore", pin)
    with pytest.raises(ModelRefused, match=r"could not be pinned in host memory .*CUDA error: out of memory\); close other"):
        load_model(str(mixtral_dir), device="cpu")


def test_weights_larger_than_the_ram_or_the_free_memory_are_refused_before_loading(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny checkpoint is float32: in bfloat16 it takes half its files' size.
    files = sum(file.stat().st_size for file in mixtral_dir.glob("*.safetensors"))

    def memory(total: int, available: int, swap: int = 0) -> None:
        monkeypatch.setattr(seqmoe.loader.psutil, "virtual_memory", lambda: SimpleNamespace(total=total, available=available))
        monkeypatch.setattr(seqmoe.loader.psutil, "swap_memory", lambda: SimpleNamespace(free=swap))

    memory(total=files * 3 // 4, available=files * 3 // 4)
    with monkeypatch.context() as reading:
        reading.setattr(seqmoe.loader.AutoModelForCausalLM, "from_pretrained", None)  # refused before any weight is read
        assert_refused(capsys, mixtral_dir, "weights take", "GiB of RAM", "choose a smaller model")
        assert_refused(capsys, mixtral_dir, "or a smaller dtype than float32", extra=("--dtype", "float32"))
        memory(total=files * 4, available=files // 2, swap=files // 4)
        assert_refused(capsys, mixtral_dir, "GiB of RAM and swap is free now", "close other programs")
    assert load_model(str(mixtral_dir), device="cpu", dtype="bfloat16").host.layout.dtype == torch.bfloat16
    memory(total=files * 4, available=files // 2, swap=files)
    assert load_model(str(mixtral_dir), device="cpu").host.layout.dtype == torch.float32


def test_the_caller_is_told_to_let_go_of_its_model_only_once_the_checks_that_take_no_memory_passed(
    mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[str] = []

    def load(folder: Path) -> None:
        load_model(str(folder), device="cpu", on_checked=lambda: released.append(folder.name))

    (tmp_path / "empty").mkdir()
    for refused in (tmp_path / "empty", tmp_path / "missing", mixtral_dir):
        with monkeypatch.context() as small:
            if refused is mixtral_dir:  # larger than all the RAM there is: refused before, too
                small.setattr(seqmoe.loader.psutil, "virtual_memory", lambda: SimpleNamespace(total=1, available=1))
            with pytest.raises(ModelRefused):
                load(refused)
    assert released == []
    # Free memory is measured after the caller let go of its model: it is what the load can have.
    monkeypatch.setattr(seqmoe.loader.psutil, "virtual_memory", lambda: SimpleNamespace(total=2**40, available=1))
    monkeypatch.setattr(seqmoe.loader.psutil, "swap_memory", lambda: SimpleNamespace(free=0))
    with pytest.raises(ModelRefused, match="free now"):
        load(mixtral_dir)
    assert released == [mixtral_dir.name]
