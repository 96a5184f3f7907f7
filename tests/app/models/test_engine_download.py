"""The engine's own download (``seqmoe generate --model <hub id>``) fetches the files the
app's download would: the top of the repository, and only the shards its index names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seqmoe.loader import load_model, resolve

from seqmoe_chat.models.repo_files import RemoteFile, download_set

from .hub_server import FakeHub

EXTRAS = "seqmoe-tests/moe-with-extras"


def test_the_engine_fetches_what_the_app_would(hub: FakeHub, tiny_repo: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_repo, tmp_path / "extras")
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    (folder / "original").mkdir()
    shutil.copy(shard, folder / "original" / "model.safetensors")  # gpt-oss's second copy of its weights
    shutil.copy(shard, folder / "consolidated.safetensors")  # Mistral's, outside the index
    hub.add(EXTRAS, folder)
    listing = {path: RemoteFile(path, 0) for path in hub.repos[EXTRAS].files}
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    expected = {f.path for f in download_set(listing, index)}

    fetched = resolve(EXTRAS)

    assert {p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()} == expected
    assert not hub.file_requests("consolidated.safetensors") and not any("original/" in r.path for r in hub.requests)
    assert load_model(EXTRAS, device="cpu").host.num_layers == 2
