"""Which files of a hub repository make up a model the engine can load, and their sizes.

The engine's download patterns decide (safetensors, JSON and tokenizer files), with two
restrictions: only files at the top of the repository (``gpt-oss`` keeps a second copy
of its weights in ``original/``), and, when the repository has a safetensors index, only
the shards the index names (Mistral repositories also carry ``consolidated.safetensors``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

INDEX_FILE = "model.safetensors.index.json"
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja")
"""``seqmoe.loader.DOWNLOAD_PATTERNS`` (a test keeps them equal). Not imported from there:
importing the engine loads PyTorch, and a download process must start in a blink."""


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


def is_wanted(path: str) -> bool:
    return "/" not in path and any(fnmatch.fnmatch(path, pattern) for pattern in DOWNLOAD_PATTERNS)


def index_shards(index: dict[str, Any]) -> set[str]:
    weight_map = index.get("weight_map")
    return set(weight_map.values()) if isinstance(weight_map, dict) else set()


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
