"""Fixtures of the model manager's tests: tiny repositories built in code and a stand-in hub
on 127.0.0.1 that every huggingface_hub call of the test (and of its child processes) uses.
The real hub and the user's token store are never touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from seqmoe.resources import demo_model_dir

from .hub_server import FakeHub

TINY = "seqmoe-tests/tiny-moe"
GATED = "seqmoe-tests/gated-moe"
DENSE = "seqmoe-tests/dense"
REMOTE_CODE = "seqmoe-tests/remote-code-moe"
PICKLE_ONLY = "seqmoe-tests/pickle-only-moe"

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


def _save(folder: Path, config: transformers.PretrainedConfig, shard: str | None = None) -> Path:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model.save_pretrained(folder, max_shard_size=shard) if shard else model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the demo model's tokenizer (vocabulary 4096)
        shutil.copy(demo_model_dir() / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-MoE in safetensors shards of about 1.5 MB with an index (the
    download process writes every MiB, so a shard is seen half written)."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=512, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    folder = _save(tmp_path_factory.mktemp("repos") / "tiny-moe", config, shard="1500KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


@pytest.fixture(scope="session")
def dense_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = transformers.Qwen3Config(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return _save(tmp_path_factory.mktemp("repos") / "dense", config)


@pytest.fixture(scope="session")
def remote_code_repo(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = shutil.copytree(tiny_repo, tmp_path_factory.mktemp("repos") / "remote-code-moe")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_custom.CustomConfig", "AutoModelForCausalLM": "modeling_custom.CustomMoe"}
    config["model_type"] = "custom_moe"  # an architecture transformers does not have: only the shipped code runs it
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def pickle_only_repo(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's config and tokenizer with pickle weights only (never loaded)."""
    folder = tmp_path_factory.mktemp("repos") / "pickle-only-moe"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_repo / name, folder / name)
    (folder / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    return folder


@pytest.fixture(autouse=True)
def hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """huggingface_hub's home (cache and token store) and the user cache (predictors) in
    ``tmp_path``, here and in child processes: the user's own are never read or written."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _cache_manager

    home = tmp_path / "hf-home"
    settings = {
        "HF_HOME": str(home), "HF_TOKEN_PATH": str(home / "token"), "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub read its environment when it was imported: tell this process too.
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(_cache_manager, "HF_HUB_CACHE", str(home / "hub"))  # scan_cache_dir's default
    return home


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, hf_home: Path, tiny_repo: Path, dense_repo: Path, remote_code_repo: Path,
        pickle_only_repo: Path):
    """The stand-in hub with the test repositories, reached by huggingface_hub here and in
    child processes (``HF_ENDPOINT``), online."""
    from huggingface_hub import constants, hf_api

    fake = FakeHub()
    fake.add(TINY, tiny_repo)
    fake.add(GATED, tiny_repo, gated=True)
    fake.add(DENSE, dense_repo)
    fake.add(REMOTE_CODE, remote_code_repo)
    fake.add(PICKLE_ONLY, pickle_only_repo)
    url = fake.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_api.api, "endpoint", url)  # the instance behind huggingface_hub.whoami and friends
    yield fake
    fake.stop()
