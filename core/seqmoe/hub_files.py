"""Which files of a Hugging Face hub repository make up a model the engine loads.

The loader's file types (safetensors weights, JSON configs, tokenizer files, chat
templates), with two restrictions: only files at the top of the repository (``gpt-oss``
keeps a second copy of its weights in ``original/``), and, when the repository has a
safetensors index, only the shards the index names (Mistral repositories also carry
``consolidated.safetensors``). The engine's download and the app's (which shows sizes
first) both choose by these rules. No PyTorch here: the app imports it in a blink.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

INDEX_FILE = "model.safetensors.index.json"
WEIGHT_PATTERN = "*.safetensors"
SMALL_PATTERNS = ("*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja")
"""Configs and tokenizer files: everything but the weights."""
DOWNLOAD_PATTERNS = (*SMALL_PATTERNS, WEIGHT_PATTERN)
IN_A_FOLDER = "*/*"
"""Matches any file below the top of a repository (``fnmatch``'s ``*`` crosses ``/``)."""


def is_wanted(path: str) -> bool:
    """Whether a file at ``path`` in the repository is of a type the loader reads, at the top."""
    return not fnmatch.fnmatch(path, IN_A_FOLDER) and any(fnmatch.fnmatch(path, pattern) for pattern in DOWNLOAD_PATTERNS)


def index_shards(index: dict[str, Any]) -> set[str]:
    """The weight files a safetensors index names; none for a damaged one (a name that is no text
    could not be sorted, or hashed, and raised)."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        return set()
    return set(weight_map.values())


def indexed_weights(folder: Path) -> list[Path] | None:
    """The weight files ``folder``'s safetensors index names, sorted (none for a damaged index);
    ``None`` when it has no index."""
    index = folder / INDEX_FILE
    if not index.is_file():
        return None
    return [folder / shard for shard in sorted(index_shards(json_object(index)))]


def json_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; empty when it cannot be read or holds anything else."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # decoding errors are ValueErrors; deep nesting recurses too far
        return {}
    return value if isinstance(value, dict) else {}


_CACHED_MODEL = "models--"
"""How the Hugging Face cache names a model repository's folder: ``models--<owner>--<name>``, whose
``snapshots/<commit>`` folders hold its revisions (repository ids never hold ``--``)."""


def model_name(folder: Path) -> str:
    """What people call the model in ``folder``: ``owner/name`` for a snapshot in the Hugging Face
    cache (whose own name is a commit hash), else the folder's name."""
    repository = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repository.startswith(_CACHED_MODEL):
        return repository[len(_CACHED_MODEL):].replace("--", "/")
    return folder.name or str(folder)
