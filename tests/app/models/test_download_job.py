"""The download child process on its own, run in this process against the stand-in hub."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from seqmoe_chat.models import download_job
from seqmoe_chat.models.hub_errors import DISK_FULL, INVALID, OFFLINE, RETRYABLE, UNSUPPORTED, HubRefusal
from seqmoe_chat.models.model_folders import SOURCE_FILE

from .conftest import REMOTE_CODE, TINY


def events(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_download_lands_verified_in_its_folder(hub, tmp_path: Path, tiny_repo: Path) -> None:
    out = io.StringIO()
    target = download_job.run(TINY, "main", tmp_path / "partial", tmp_path / "done", download_job.Reporter(out))
    assert target == tmp_path / "done" and not (tmp_path / "partial").exists()
    for name in ("config.json", "model.safetensors.index.json", "tokenizer.json"):
        assert (target / name).read_bytes() == (tiny_repo / name).read_bytes()
    shards = sorted(p.name for p in target.glob("*.safetensors"))
    assert shards == sorted(p.name for p in tiny_repo.glob("*.safetensors")) and len(shards) >= 2
    assert json.loads((target / SOURCE_FILE).read_text())["repo_id"] == TINY
    kinds = [e["event"] for e in events(out)]
    assert kinds[0] == "plan" and kinds[-1] == "verifying" and "progress" in kinds
    plan = events(out)[0]
    assert plan["total_bytes"] == sum(p.stat().st_size for p in tiny_repo.iterdir() if p.is_file())


def test_a_folder_in_the_way_that_is_not_this_download_is_refused_once(hub, tmp_path: Path) -> None:
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "notes.txt").write_text("mine")
    with pytest.raises(HubRefusal) as refused:
        download_job.run(TINY, "main", tmp_path / "partial", tmp_path / "done", download_job.Reporter(io.StringIO()))
    assert refused.value.kind == INVALID and refused.value.kind not in RETRYABLE
    assert str(refused.value) == f"{tmp_path / 'done'} already exists and is not this download; move or delete it, then resume"
    assert (tmp_path / "done" / "notes.txt").read_text() == "mine" and not hub.requests


def test_a_hub_that_does_not_list_the_files_is_given_up_on(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.listing_delay_s = 3.0
    monkeypatch.setattr(download_job, "HUB_TIMEOUT_S", 0.5)
    with pytest.raises(HubRefusal) as refused:
        download_job.run(TINY, "main", tmp_path / "partial", tmp_path / "done", download_job.Reporter(io.StringIO()))
    assert refused.value.kind == OFFLINE and "cannot be reached" in str(refused.value)


def test_a_download_that_does_not_open_is_refused_by_its_repository_name(hub, tmp_path: Path) -> None:
    staging = tmp_path / "seqmoe-tests--remote-code-moe"
    with pytest.raises(HubRefusal) as refused:
        download_job.run(REMOTE_CODE, "main", staging, tmp_path / "done", download_job.Reporter(io.StringIO()))
    assert refused.value.kind == UNSUPPORTED and staging.name not in str(refused.value)
    assert str(refused.value).startswith(f"the downloaded model does not open: {REMOTE_CODE} needs its own remote code")


def test_too_little_disk_space_is_refused_before_any_weight(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqmoe_chat.models import disk_space

    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    with pytest.raises(HubRefusal) as refused:
        download_job.run(TINY, "main", tmp_path / "partial", tmp_path / "done", download_job.Reporter(io.StringIO()))
    assert refused.value.kind == DISK_FULL and "not enough disk space" in str(refused.value)
    assert not hub.file_requests(".safetensors")


def test_only_top_level_files_and_the_indexed_shards_are_chosen() -> None:
    from seqmoe_chat.models.repo_files import RemoteFile, download_set

    files = {p: RemoteFile(p, 10) for p in (
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "consolidated.safetensors",
        "original/model.safetensors", "pytorch_model.bin", "tokenizer.model", "README.md", "model.safetensors.index.json",
    )}
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    assert [f.path for f in download_set(files, index)] == [
        "config.json", "model.safetensors.index.json", "tokenizer.model",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]


def test_a_download_resumed_after_the_repository_moved_on_installs_the_new_commits_files(
    hub, tmp_path: Path, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging, target = tmp_path / "partial", tmp_path / "done"
    refuse = HubRefusal(DISK_FULL, "stopped for the test after every file arrived")
    with monkeypatch.context() as patched, pytest.raises(HubRefusal):
        patched.setattr(download_job, "_check_loadable", lambda folder, repo_id: (_ for _ in ()).throw(refuse))
        download_job.run(TINY, "main", staging, target, download_job.Reporter(io.StringIO()))
    # A new commit changes the config without changing its size (no checksum on the hub for it).
    repo = hub.repos[TINY]
    old = repo.files["config.json"]
    new = old.replace(b'"eos_token_id": 2', b'"eos_token_id": 3')
    assert new != old and len(new) == len(old)
    repo.files["config.json"], repo.commit = new, "b" * 40
    shards_fetched = len(hub.file_requests(".safetensors"))
    download_job.run(TINY, "main", staging, target, download_job.Reporter(io.StringIO()))
    assert (target / "config.json").read_bytes() == new
    assert json.loads((target / SOURCE_FILE).read_text())["commit"] == "b" * 40
    # The weights, checked against the hub's SHA-256, were kept, not fetched again.
    assert len(hub.file_requests(".safetensors")) == shards_fetched


def test_every_damaged_file_is_named_and_removed_at_once(tmp_path: Path) -> None:
    from seqmoe_chat.models.repo_files import RemoteFile

    (tmp_path / "a.safetensors").write_bytes(b"damaged")
    (tmp_path / "b.safetensors").write_bytes(b"short")
    (tmp_path / "config.json").write_bytes(b"{}")
    files = [RemoteFile("a.safetensors", 7, "0" * 64), RemoteFile("b.safetensors", 9, None), RemoteFile("config.json", 2, None)]
    with pytest.raises(HubRefusal, match="a.safetensors does not match .*; b.safetensors has 5 bytes, the hub lists 9; they"):
        download_job._verify(tmp_path, files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
