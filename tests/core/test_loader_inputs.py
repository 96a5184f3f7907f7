"""Model folders the loader used to trust too far: pickle weights beside a stray safetensors file, a
config asking for more than its checkpoint holds, a header lying about dtypes, names and files that
ended in a traceback, settings it misnamed. Each is refused in one line, before any weight is read."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import seqmoe.loader
from seqmoe import ModelRefused, load_model

from .test_refusals import assert_refused, copy_model


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def relabel(weights: Path, dtype: str, keys_with: str = "") -> None:
    """Rewrite the header of ``weights`` to give ``dtype`` to the tensors whose names hold ``keys_with``,
    their bytes left as they are."""
    data = weights.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    for key, entry in header.items():
        if key != "__metadata__" and keys_with in key:
            entry["dtype"] = dtype
    encoded = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])


@pytest.fixture
def no_weight_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals made before any weight is read: loading one fails the test."""
    monkeypatch.setattr(seqmoe.loader.AutoModelForCausalLM, "from_pretrained", None)


def test_pickle_weights_beside_a_stray_safetensors_file_are_refused(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any *.safetensors (an adapter's, say) used to pass for the checkpoint; transformers then unpickled the .bin.
    folder = copy_model(mixtral_dir, tmp_path / "pickled")
    weights = load_file(str(folder / "model.safetensors"))
    torch.save(weights, folder / "pytorch_model.bin")
    save_file({"lm_head.weight": weights["lm_head.weight"]}, str(folder / "adapter_model.safetensors"))
    (folder / "model.safetensors").unlink()
    unpickled = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: unpickled.append(args))
    assert_refused(capsys, folder, "pickled has only pickle weights (.bin)")
    assert unpickled == []


def test_transformers_is_never_let_fall_back_on_pickle_weights(
    mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "pickled")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    unpickled = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: unpickled.append(args))
    monkeypatch.setattr(seqmoe.loader, "check_weights", lambda *args: [])  # as if a check had let it through
    with pytest.raises(ModelRefused, match="loading the weights of pickled failed"):
        load_model(str(folder), device="cpu")
    assert unpickled == []


@pytest.mark.parametrize("named", ["adapter_model.bin", "other.safetensors"])
def test_weights_that_config_json_names_for_transformers_are_refused_unless_the_checked_ones(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    # transformers opens the file transformers_weights names before model.safetensors: a .bin was unpickled
    # though model.safetensors, which the checks read, was there.
    folder = copy_model(mixtral_dir, tmp_path / "named")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "adapter_model.bin")
    (folder / "other.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    edit_config(folder, transformers_weights=named)
    unpickled = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: unpickled.append(args))
    assert_refused(capsys, folder, f"names '{named}' for its weights (transformers_weights)")
    assert unpickled == []

# It used to be found missing only once allocated: 38 s and 2.7 GB for 10000 layers, the allocator's
# traceback for 10**9 experts.
@pytest.mark.parametrize(("key", "value", "asked"), [
    ("num_hidden_layers", 40, "(40 layers of up to 8 experts)"),
    ("num_local_experts", 10**9, "(3 layers of up to 1000000000 experts)"),
])
def test_a_config_asking_for_more_than_its_checkpoint_holds_is_refused_before_loading(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, no_weight_read: None,
    key: str, value: int, asked: str,
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "inflated")
    edit_config(folder, **{key: value})
    assert_refused(capsys, folder, "weights of inflated do not have the shapes its config.json gives",
                   "parameters in the checkpoint", asked)


def test_the_ram_a_model_needs_is_its_size_in_the_configs_dtype_when_larger_than_its_files(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_weight_read: None,
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "bf16")
    weights = load_file(str(folder / "model.safetensors"))
    # The config still says float32, which transformers loads it in: twice the files.
    save_file({key: tensor.bfloat16() for key, tensor in weights.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    files = (folder / "model.safetensors").stat().st_size
    memory = SimpleNamespace(total=files * 3 // 2, available=files * 3 // 2)
    monkeypatch.setattr(seqmoe.loader.psutil, "virtual_memory", lambda: memory)
    monkeypatch.setattr(seqmoe.loader.psutil, "swap_memory", lambda: SimpleNamespace(free=0))
    assert_refused(capsys, folder, "bf16's weights take", "GiB of RAM")


# The same four bytes an element read as integers: it used to load and answer token 0 after token 0.
@pytest.mark.parametrize(("keys_with", "example"), [
    ("", "lm_head.weight"),
    (".experts.", "model.layers.0.block_sparse_moe.experts.0.w1.weight"),  # fused into one tensor as they load
])
def test_integers_stored_for_floating_point_weights_are_refused(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, no_weight_read: None,
    keys_with: str, example: str,
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "lying")
    relabel(folder / "model.safetensors", "I32", keys_with)
    assert_refused(capsys, folder, "weights of lying are stored as integers where the model has floating-point numbers",
                   f"e.g. {example}: I32")


def test_a_dtype_its_bytes_do_not_fit_is_refused_before_loading(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, no_weight_read: None
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "lying")
    relabel(folder / "model.safetensors", "F16", "lm_head")  # two bytes an element, for four stored
    assert_refused(capsys, folder, "loading the weights of lying failed on model.safetensors",
                   "invalid shape, data type, or offset")


@pytest.mark.parametrize(("model", "words"), [
    ("abc/d--e", ("no such model folder: abc/d--e, nor a hub id", "Cannot have -- or ..")),
    ("org/name.", ("nor a hub id",)),
    ("org/" + "n" * 100, ("nor a hub id", "maximum length is 96")),
    ("~no-such-user-of-seqmoe/model", ("no such model folder: ~no-such-user-of-seqmoe/model",)),
    ("x" * 300, ("cannot be read: File name too long",)),
])
def test_a_name_that_is_no_folder_nor_hub_id_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], model: str, words: tuple[str, ...]
) -> None:
    assert_refused(capsys, model, *words)


@pytest.mark.parametrize(("changes", "words"), [
    ({"quantization_config": "gptq"}, ("AttributeError",)),
    ({"dtype": "float8"}, ("AttributeError",)),
    ({"dtype": [1]}, ()),
    ({"layer_types": 0}, ("TypeError",)),
    ({"model_type": ["mixtral"]}, ()),
])
def test_config_values_transformers_cannot_read_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, changes: dict, words: tuple[str, ...]
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "odd")
    edit_config(folder, **changes)
    assert_refused(capsys, folder, "config.json", *words)


NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("name", "content", "words"), [
    ("config.json", NESTED, ("config.json is not valid JSON", "recursion")),
    ("config.json", b'{"vocab_size": ' + b"1" * 5000 + b"}", ("config.json is not valid JSON",)),
    ("model.safetensors", struct.pack("<Q", len(NESTED)) + NESTED, ("model.safetensors has a corrupt header",)),
    ("tokenizer.json", NESTED, ("no usable tokenizer",)),
    ("tokenizer_config.json", b"[1, 2]", ("no usable tokenizer",)),
    ("tokenizer_config.json", b'"a tokenizer"', ("no usable tokenizer",)),
])
def test_files_transformers_or_json_cannot_parse_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, name: str, content: bytes,
    words: tuple[str, ...],
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "odd")
    (folder / name).write_bytes(content)
    assert_refused(capsys, folder, *words)


def test_a_tokenizer_class_that_is_no_name_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "odd")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": 5}))
    assert_refused(capsys, folder, "no usable tokenizer")


def test_more_experts_a_token_than_there_are_is_refused_before_loading(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, no_weight_read: None
) -> None:
    # It used to fail only while generating, blamed on transformers.
    folder = copy_model(mixtral_dir, tmp_path / "greedy")
    edit_config(folder, num_experts_per_tok=16)
    assert_refused(capsys, folder, "MixtralConfig gives each token 16 experts, more than the 8 it has")


def test_a_config_without_layers_is_named_as_such(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path
) -> None:
    # It used to be called an MoE whose experts bypass transformers' experts interface.
    folder = copy_model(mixtral_dir, tmp_path / "hollow")
    edit_config(folder, num_hidden_layers=0)
    assert_refused(capsys, folder, "the config.json of this MixtralForCausalLM has no layers (num_hidden_layers 0)")


# Python's json reads NaN and Infinity: such a config used to load, then reply with nothing (NaN logits).
@pytest.mark.parametrize(("changes", "named"), [
    ({"rms_norm_eps": math.nan}, "rms_norm_eps is NaN"),
    ({"rope_scaling": {"rope_type": "linear", "factor": math.inf}}, "rope_scaling.factor is Infinity"),
    ({"head_dim": 8, "rope_scaling": {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 128,
                                      "short_factor": [1.0] * 4, "long_factor": [1.0, -math.inf, 1.0, 1.0]}},
     "rope_scaling.long_factor[1] is -Infinity"),
    ({"odd\nkey": {"depth": [[math.nan]]}}, '"odd\\nkey".depth[0][0] is NaN'),  # its line break kept out of the line
])
def test_a_config_holding_a_number_that_is_not_finite_is_refused_by_its_key(
    capsys: pytest.CaptureFixture[str], mixtral_dir: Path, tmp_path: Path, no_weight_read: None,
    changes: dict, named: str,
) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "unbounded")
    edit_config(folder, **changes)
    assert_refused(capsys, folder, f"config.json of unbounded: {named}; a model's config holds finite numbers")


def test_the_command_refuses_a_config_holding_nan_in_one_line(mixtral_dir: Path, tmp_path: Path) -> None:
    folder = copy_model(mixtral_dir, tmp_path / "unbounded")
    edit_config(folder, rms_norm_eps=math.nan)
    result = subprocess.run(
        [sys.executable, "-m", "seqmoe", "generate", "--model", str(folder), "--prompt", "hi", "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "seqmoe: error: config.json of unbounded: rms_norm_eps is NaN; a model's config holds finite numbers"
    ]
