"""Where the model manager keeps models in the app's data folder.

``models/<owner>--<name>/`` holds a finished, verified download; ``models/.partial/<owner>--<name>/``
the files of one in progress (kept across cancels and restarts). A finished folder carries
``.seqmoe-source.json`` saying which repository and commit it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .json_file import StoredFileError, read_json

SOURCE_FILE = ".seqmoe-source.json"
SOURCE_FORMAT = "seqmoe-model-source"
SOURCE_VERSION = 1


def models_dir(data_dir: Path) -> Path:
    return data_dir / "models"


def folder_name(repo_id: str) -> str:
    return repo_id.replace("/", "--")


def target_dir(data_dir: Path, repo_id: str) -> Path:
    return models_dir(data_dir) / folder_name(repo_id)


def partial_dir(data_dir: Path) -> Path:
    return models_dir(data_dir) / ".partial"


def staging_dir(data_dir: Path, repo_id: str) -> Path:
    return partial_dir(data_dir) / folder_name(repo_id)


def read_source(folder: Path) -> dict[str, Any]:
    """What ``folder``'s source file says of its download; empty when it has none, or one that
    cannot be read (kept aside by ``read_json``)."""
    try:
        return read_json(folder / SOURCE_FILE, SOURCE_FORMAT, SOURCE_VERSION) or {}
    except StoredFileError:
        return {}
