"""The models on this computer: those the app downloaded, those already in the Hugging Face
cache, folders imported by hand, and the bundled demo model; their size on disk, deleting
them and importing a folder."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .json_file import StoredFileError, read_json_as, write_json
from .model_folders import models_dir, read_source
from .predictor_state import PredictorState, predictor_state

LIBRARY_FILE = "library.json"
LIBRARY_FORMAT = "seqmoe-chat-library"
LIBRARY_VERSION = 1

DOWNLOADED = "downloaded"
HUB_CACHE = "Hugging Face cache"
IMPORTED = "imported"
BUNDLED = "bundled"


class LibraryError(Exception):
    """A library operation that cannot be done; the message says why."""


@dataclass(frozen=True)
class LibraryModel:
    name: str
    path: Path
    source: str
    size_bytes: int
    repo_id: str = ""
    revision: str = ""  # the commit of a Hugging Face cache snapshot
    missing: bool = False  # an imported folder moved or deleted since: listed to be taken off, not to be loaded


@dataclass(frozen=True)
class LibraryItem:
    model: LibraryModel
    predictor: PredictorState


class Library:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.notice = ""
        self._file = data_dir / LIBRARY_FILE
        self._lock = threading.Lock()
        """Held to change ``imported``: each import runs on a thread of its own."""
        try:
            self.imported = read_json_as(self._file, LIBRARY_FORMAT, LIBRARY_VERSION, _imported) or []
        except StoredFileError as error:
            self.notice = f"The list of imported folders was reset: {error}"
            self.imported = []

    def models(self, include_hub_cache: bool = True) -> list[LibraryModel]:
        from seqmoe.resources import demo_model_dir

        found = [*self._downloaded(), *(self._hub_cache() if include_hub_cache else [])]
        # Kept on the list, not dropped: a folder on a drive not plugged in now comes back with it.
        found += [LibraryModel(p.name, p, IMPORTED, _size(p), missing=not (p / "config.json").is_file())
                  for p in self.imported]
        demo = demo_model_dir()
        if (demo / "config.json").is_file():
            found.append(LibraryModel("SeqMoE demo", demo, BUNDLED, _size(demo)))
        return found

    def items(self) -> list[LibraryItem]:
        """Every model with its predictor's state (this reads files and imports the engine: call it
        off the GUI thread)."""
        return [LibraryItem(model, predictor_state(model.path)) for model in self.models()]

    def import_folder(self, folder: Path) -> LibraryModel:
        """Add a model folder after the engine loader's checks; raises ``seqmoe.ModelRefused``."""
        from .folder_check import check_model_folder

        folder = folder.expanduser().resolve()
        self._refuse_known(folder)  # before the slow check, to answer a repeated import at once
        check_model_folder(folder)
        with self._lock:
            self._refuse_known(folder)  # another import may have added it during the check
            self._keep([*self.imported, folder])
        return LibraryModel(folder.name, folder, IMPORTED, _size(folder))

    def delete(self, model: LibraryModel) -> None:
        """Delete a downloaded model or a Hugging Face cache snapshot; an imported folder is only
        taken off the list (its files are the person's own)."""
        if model.source == BUNDLED:
            raise LibraryError("the bundled demo model is part of the app and cannot be deleted")
        if model.source == IMPORTED:
            with self._lock:
                self._keep([p for p in self.imported if p != model.path])
            return
        try:
            if model.source == HUB_CACHE:
                _delete_snapshot(model)
            else:
                shutil.rmtree(model.path)
        except FileNotFoundError:
            pass  # deleted by hand since it was listed: gone, as asked
        except OSError as error:
            raise LibraryError(f"{model.path} could not be deleted: {error.strerror or error}") from None

    def _downloaded(self) -> list[LibraryModel]:
        root = models_dir(self.data_dir)
        if not root.is_dir():
            return []
        found = []
        # A folder without config.json is no model (notes, a half-removed folder); the loader judges the rest.
        for folder in sorted(p for p in root.iterdir() if (p / "config.json").is_file() and not p.name.startswith(".")):
            repo_id = _source_repo(folder)
            found.append(LibraryModel(repo_id or folder.name, folder, DOWNLOADED, _size(folder), repo_id))
        return found

    def _hub_cache(self) -> list[LibraryModel]:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

        try:
            cache = scan_cache_dir()
        except CacheNotFound:
            return []
        except CorruptedCacheException as error:
            self.notice = f"The Hugging Face cache could not be read: {error}"
            return []
        found = []
        for repo in sorted(cache.repos, key=lambda r: r.repo_id):
            revisions = [r for r in repo.revisions if repo.repo_type == "model" and _looks_like_moe(r.snapshot_path)]
            for revision in revisions:
                name = repo.repo_id if len(revisions) == 1 else f"{repo.repo_id} ({revision.commit_hash[:8]})"
                found.append(LibraryModel(name, revision.snapshot_path, HUB_CACHE, revision.size_on_disk,
                                          repo.repo_id, revision.commit_hash))
        return found

    def _refuse_known(self, folder: Path) -> None:
        if folder in self.imported or folder.parent == models_dir(self.data_dir):
            raise LibraryError(f"{folder} is already in the library")

    def _keep(self, imported: list[Path]) -> None:
        """Save ``imported`` as the list of imported folders, then list them: a change that could
        not be saved is not shown either (it would be gone at the next start)."""
        try:
            write_json(self._file, LIBRARY_FORMAT, LIBRARY_VERSION, {"imported": [str(p) for p in imported]})
        except OSError as error:
            raise LibraryError(f"the library list could not be saved: {error.strerror or error}") from None
        self.imported = imported


def _delete_snapshot(model: LibraryModel) -> None:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return  # the whole cache was removed since it was listed: gone, as asked
    except CorruptedCacheException as error:
        raise LibraryError(f"{model.path} could not be deleted: the Hugging Face cache could not be read: "
                           f"{error}") from None
    # A revision removed since it was listed is skipped (with a warning); execute() only logs the
    # files it could not delete (a read-only cache, another user's): the folder tells what happened.
    cache.delete_revisions(model.revision).execute()
    if model.path.exists():
        raise LibraryError(f"{model.path} could not be deleted: its files in the Hugging Face cache could not be removed "
                           "(a read-only cache, or another user's?)")


def _source_repo(folder: Path) -> str:
    return str(read_source(folder).get("repo_id", ""))


def _looks_like_moe(snapshot: Path) -> bool:
    """A cached snapshot with weights whose config mentions experts; the loader decides the rest."""
    try:
        config = json.loads((snapshot / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return _has_weights(snapshot) and isinstance(config, dict) and any("expert" in key for key in _flat_keys(config))


def _has_weights(folder: Path) -> bool:
    """Safetensors weights, with every shard that the index names (an interrupted download lacks some)."""
    from seqmoe.hub_files import indexed_weights

    files = indexed_weights(folder)
    if files is None:
        return any(folder.glob("*.safetensors"))
    return bool(files) and all(file.is_file() for file in files)


def _flat_keys(config: dict) -> list[str]:
    """Keys of the config and of its nested configs (multimodal models keep the text model's apart)."""
    keys = list(config)
    for value in config.values():
        if isinstance(value, dict):
            keys += _flat_keys(value)
    return keys


def _imported(stored: dict[str, Any]) -> list[Path]:
    folders = stored.get("imported", [])
    if not isinstance(folders, list) or not all(isinstance(folder, str) for folder in folders):
        raise ValueError(f'"imported" is {folders!r:.80}, not a list of folders')
    return [Path(folder) for folder in folders]


def _size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # a file removed while counting
    return total
