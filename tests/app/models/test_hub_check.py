"""A hub id or address is checked from its config.json alone before a download is offered."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from tests.core.conftest import without_chat_template

from seqmoe_chat.models.hub_check import HubReference, check_repo, parse_reference, save_token
from seqmoe_chat.models.hub_errors import GATED, INVALID, NO_WEIGHTS, NOT_FOUND, OFFLINE, UNSUPPORTED, HubRefusal

from .conftest import DENSE, GATED as GATED_REPO
from .conftest import PICKLE_ONLY, REMOTE_CODE, TINY
from .hub_server import TOKEN


@pytest.mark.parametrize(("text", "repo_id", "revision"), [
    ("allenai/OLMoE-1B-7B-0924-Instruct", "allenai/OLMoE-1B-7B-0924-Instruct", "main"),
    ("  https://huggingface.co/Qwen/Qwen3-30B-A3B-Instruct-2507  ", "Qwen/Qwen3-30B-A3B-Instruct-2507", "main"),
    ("https://huggingface.co/openai/gpt-oss-20b/tree/refs%2Fpr%2F3", "openai/gpt-oss-20b", "refs/pr/3"),
    ("hf.co/ibm-granite/granite-3.1-3b-a800m-instruct/blob/v1/config.json", "ibm-granite/granite-3.1-3b-a800m-instruct", "v1"),
    ("https://huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1?library=transformers", "mistralai/Mixtral-8x7B-Instruct-v0.1", "main"),
    ("allenai/OLMoE-1B-7B-0924-Instruct/", "allenai/OLMoE-1B-7B-0924-Instruct", "main"),
])
def test_hub_ids_and_addresses_are_understood(text: str, repo_id: str, revision: str) -> None:
    assert parse_reference(text) == HubReference(repo_id, revision)


@pytest.mark.parametrize("text", [
    "", "just-a-name", "https://example.com/a/b", "../../etc/passwd", "a/b/c d",
    # Refused by huggingface_hub's rules, which the app's own pattern let through.
    "t/tiny-moé", "t/tiny-moe.git", "t/-tiny", "t/tiny--moe",
])
def test_anything_else_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(HubRefusal) as refused:
        parse_reference(text)
    assert refused.value.kind == INVALID and "not a hub id" in str(refused.value)


@pytest.mark.parametrize(("text", "what"), [
    ("https://huggingface.co/datasets/t/tiny-moe", "a dataset"),
    ("huggingface.co/spaces/t/tiny-moe/", "a Space"),
])
def test_dataset_and_space_addresses_are_said_not_to_be_models(text: str, what: str) -> None:
    with pytest.raises(HubRefusal) as refused:
        parse_reference(text)
    assert refused.value.kind == INVALID and str(refused.value) == f"{text!r} is {what}, not a model: seqmoe downloads models only"


def test_a_supported_model_is_described_without_fetching_weights(hub, tiny_repo: Path) -> None:
    model = check_repo(HubReference(TINY))
    assert model.architecture == "Qwen3MoeForCausalLM" and model.license == "apache-2.0" and model.gated is False
    shape = model.shape
    assert (shape.moe_layers, shape.experts_per_layer, shape.top_k) == (2, 8, 2)
    assert shape.bytes_per_expert == 3 * 64 * 64 * 4  # gate, up and down of 64 x 64, float32
    assert model.download_bytes == sum(p.stat().st_size for p in tiny_repo.iterdir())
    assert not hub.file_requests(".safetensors")


@pytest.mark.parametrize(("repo_id", "words"), [
    (DENSE, "not a Mixture-of-Experts model"),
    (REMOTE_CODE, "needs its own remote code"),
])
def test_an_unsupported_model_is_refused_before_any_weight_is_requested(hub, repo_id: str, words: str) -> None:
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference(repo_id))
    assert refused.value.kind == UNSUPPORTED and words in str(refused.value)
    assert {r.path.rsplit("/", 1)[-1] for r in hub.file_requests()} <= {"config.json", "tokenizer_config.json"}


def test_a_model_with_pickle_weights_only_is_refused(hub) -> None:
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference(PICKLE_ONLY))
    assert refused.value.kind == NO_WEIGHTS and "never loads pickle" in str(refused.value)
    assert not hub.file_requests(".bin")


def test_a_gated_model_asks_for_a_token_and_opens_with_one(hub, tmp_path: Path) -> None:
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference(GATED_REPO))
    assert refused.value.kind == GATED and "accept its licence" in str(refused.value) and GATED_REPO in str(refused.value)
    with pytest.raises(HubRefusal) as bad:
        save_token("hf_not_the_token")
    assert bad.value.kind == INVALID and "refused this token" in str(bad.value)
    assert not (tmp_path / "hf-home" / "token").exists()
    save_token(TOKEN)
    assert check_repo(HubReference(GATED_REPO)).architecture == "Qwen3MoeForCausalLM"


def test_unknown_repositories_and_revisions(hub) -> None:
    with pytest.raises(HubRefusal) as missing:
        check_repo(HubReference("seqmoe-tests/no-such-model"))
    assert missing.value.kind == NOT_FOUND and "no model seqmoe-tests/no-such-model" in str(missing.value)


def test_offline_says_that_downloads_need_a_connection(hub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference(TINY))
    assert refused.value.kind == OFFLINE and "downloads need a connection" in str(refused.value)
    assert not hub.requests


def test_a_config_giving_a_token_more_experts_than_there_are_is_refused_as_unsupported(
    hub, tiny_repo: Path, tmp_path: Path
) -> None:
    # The loader's refusal escaped the check as an engine error, not the hub panel's refusal.
    folder = shutil.copytree(tiny_repo, tmp_path / "greedy-moe")
    config = json.loads((folder / "config.json").read_text())
    config["num_experts_per_tok"] = 9  # of 8
    (folder / "config.json").write_text(json.dumps(config))
    hub.add("seqmoe-tests/greedy-moe", folder)
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference("seqmoe-tests/greedy-moe"))
    assert refused.value.kind == UNSUPPORTED and "more than the 8 it has" in str(refused.value)


def test_a_config_holding_nan_is_refused_as_unsupported_by_its_key(hub, tiny_repo: Path, tmp_path: Path) -> None:
    # It was offered for download; once loaded, its every reply came out empty.
    folder = shutil.copytree(tiny_repo, tmp_path / "nan-moe")
    config = json.loads((folder / "config.json").read_text())
    config["rms_norm_eps"] = math.nan
    (folder / "config.json").write_text(json.dumps(config))
    hub.add("seqmoe-tests/nan-moe", folder)
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference("seqmoe-tests/nan-moe"))
    assert refused.value.kind == UNSUPPORTED
    assert "config.json of nan-moe: rms_norm_eps is NaN; a model's config holds finite numbers" in str(refused.value)
    assert not hub.file_requests(".safetensors")


def test_a_model_without_a_chat_template_is_refused_before_its_download(hub, tiny_repo: Path, tmp_path: Path) -> None:
    # The app refuses it once loaded: downloading it would have been tens of GB for nothing.
    base = without_chat_template(tiny_repo, tmp_path / "base-moe")
    hub.add("seqmoe-tests/base-moe", base)
    with pytest.raises(HubRefusal) as refused:
        check_repo(HubReference("seqmoe-tests/base-moe"))
    assert refused.value.kind == UNSUPPORTED
    assert str(refused.value).startswith("seqmoe-tests/base-moe has no chat template: it is not made for chat")
    assert not hub.file_requests(".safetensors")
    # A processor's template file: the tokenizer never reads it, so the loader would refuse the model.
    template = json.loads((tiny_repo / "tokenizer_config.json").read_text())["chat_template"]
    (base / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    hub.add("seqmoe-tests/base-moe", base)
    with pytest.raises(HubRefusal) as processor_only:
        check_repo(HubReference("seqmoe-tests/base-moe"))
    assert processor_only.value.kind == UNSUPPORTED and "has no chat template" in str(processor_only.value)
    # Newer repositories keep the template in a file of its own.
    (base / "chat_template.jinja").write_text(template)
    hub.add("seqmoe-tests/base-moe", base)
    assert check_repo(HubReference("seqmoe-tests/base-moe")).architecture == "Qwen3MoeForCausalLM"
