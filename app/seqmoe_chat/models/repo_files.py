"""The files of a hub repository that the engine's rules choose (``seqmoe.hub_files``), with
their sizes, so the app can show and check them before it downloads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from seqmoe.hub_files import INDEX_FILE, index_shards, is_wanted

__all__ = ["HUB_TIMEOUT_S", "INDEX_FILE", "RemoteFile", "download_set", "remote_files", "total_size"]

HUB_TIMEOUT_S = 30.0
"""How long the check and the download wait for the hub's file listing (huggingface_hub's client
waits forever)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None  # known for files stored with Git LFS (the weights)

    @property
    def is_weights(self) -> bool:
        return self.path.endswith(".safetensors")


def remote_files(siblings: Iterable[Any]) -> dict[str, RemoteFile]:
    """The files of a ``model_info(..., files_metadata=True)`` answer, by path."""
    return {
        s.rfilename: RemoteFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs is not None else None)
        for s in siblings
    }


def download_set(files: dict[str, RemoteFile], index: dict[str, Any] | None) -> list[RemoteFile]:
    """The files to fetch, small ones first so that config and index arrive before the weights."""
    shards = index_shards(index) if index is not None else None
    chosen = [
        f for f in files.values()
        if is_wanted(f.path) and (not f.is_weights or shards is None or f.path in shards)
    ]
    return sorted(chosen, key=lambda f: (f.is_weights, f.size, f.path))


def total_size(files: Iterable[RemoteFile]) -> int:
    return sum(f.size for f in files)
