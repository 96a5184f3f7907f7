"""The library when things happen at once: imports on threads of their own, a cache changed
while it is deleted from, a model deleted while it loads, listings answered out of order."""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication

from seqmoe_chat.model_manager.manager import ModelManager
from seqmoe_chat.models import folder_check, library as library_module
from seqmoe_chat.models.download_runner import DownloadRunner
from seqmoe_chat.models.library import HUB_CACHE, Library, LibraryError, LibraryItem, LibraryModel
from seqmoe_chat.models.model_folders import target_dir
from seqmoe_chat.models.predictor_state import predictor_state

from .conftest import TINY


def cached_model(tiny_repo: Path, data_dir: Path) -> LibraryModel:
    """The tiny model as ``hf_hub_download`` leaves it in the Hugging Face cache (needs ``hub``)."""
    from huggingface_hub import hf_hub_download

    for file in tiny_repo.iterdir():
        hf_hub_download(TINY, file.name)
    (model,) = [m for m in Library(data_dir).models() if m.source == HUB_CACHE]
    return model


def test_two_imports_at_once_keep_both_folders(data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    folders = [tmp_path / "a", tmp_path / "b"]
    library = Library(data_dir)
    monkeypatch.setattr(folder_check, "check_model_folder", lambda folder: None)
    real_write = library_module.write_json
    both_writing = threading.Barrier(2, timeout=1.0)

    def write_json(*args, **kwargs) -> None:
        # Unguarded, both imports read the list before either saves it and meet here; guarded, the
        # second waits for the first to finish, and this wait gives up.
        with contextlib.suppress(threading.BrokenBarrierError):
            both_writing.wait()
        real_write(*args, **kwargs)

    monkeypatch.setattr(library_module, "write_json", write_json)
    imports = [threading.Thread(target=library.import_folder, args=(folder,)) for folder in folders]
    for thread in imports:
        thread.start()
    for thread in imports:
        thread.join()
    assert sorted(library.imported) == folders and sorted(Library(data_dir).imported) == folders


def test_a_folder_imported_again_during_its_first_check_is_refused(data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    library = Library(data_dir)
    folder = tmp_path / "a"
    checks = []

    def check(checked: Path) -> None:
        checks.append(checked)
        if len(checks) == 1:  # "Import folder…" on the same folder again while the first check runs
            library.import_folder(folder)

    monkeypatch.setattr(folder_check, "check_model_folder", check)
    with pytest.raises(LibraryError, match="already in the library"):
        library.import_folder(folder)
    assert library.imported == [folder] and Library(data_dir).imported == [folder]


def test_a_hugging_face_cache_removed_since_the_listing_is_deleted_without_error(
        hub, hf_home: Path, data_dir: Path, tiny_repo: Path) -> None:
    model = cached_model(tiny_repo, data_dir)
    shutil.rmtree(hf_home / "hub")  # `hf cache delete`, or the folder removed by hand
    Library(data_dir).delete(model)
    with_revision_gone = cached_model(tiny_repo, data_dir)
    shutil.rmtree(with_revision_gone.path.parent.parent)  # only this repository's folder
    Library(data_dir).delete(with_revision_gone)


def test_a_hugging_face_cache_snapshot_that_could_not_be_deleted_says_so(
        hub, data_dir: Path, tiny_repo: Path, monkeypatch) -> None:
    from huggingface_hub.utils import _cache_manager

    model = cached_model(tiny_repo, data_dir)

    def denied(path, *args, **kwargs) -> None:  # a read-only cache; the tests may run as root
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_cache_manager.shutil, "rmtree", denied)
    with pytest.raises(LibraryError, match="could not be deleted"):
        Library(data_dir).delete(model)
    assert model.path.is_dir()


def test_a_hugging_face_cache_model_loading_by_its_hub_id_is_not_deleted(
        qtbot, hub, data_dir: Path, tiny_repo: Path) -> None:
    model = cached_model(tiny_repo, data_dir)
    manager = ModelManager(data_dir, loaded_path=lambda: TINY, downloads=DownloadRunner(data_dir))
    with pytest.raises(LibraryError, match="loaded or loading"):
        manager.delete(LibraryItem(model, predictor_state(model.path)))
    assert model.path.is_dir()


def test_an_older_listing_answered_after_a_newer_one_is_ignored(qtbot, data_dir: Path, tiny_repo: Path,
                                                                 monkeypatch) -> None:
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    manager = ModelManager(data_dir, downloads=DownloadRunner(data_dir))
    manager.refresh_library()
    qtbot.waitUntil(lambda: any(i.model.path == folder for i in manager.items))
    item = next(i for i in manager.items if i.model.path == folder)
    real = manager.library.items
    older: list[threading.Thread] = []
    older_may_answer = threading.Event()

    def items() -> list[LibraryItem]:
        listed = real()
        if not older:  # the Refresh just before the deletion: its scan (a large cache) is slower
            older.append(threading.current_thread())
            older_may_answer.wait(timeout=30)
        return listed

    monkeypatch.setattr(manager.library, "items", items)
    manager.refresh_library()
    qtbot.waitUntil(lambda: bool(older))  # it has listed the folder
    manager.delete(item)
    qtbot.waitUntil(lambda: all(i.model.path != folder for i in manager.items))
    older_may_answer.set()
    older[0].join()
    QCoreApplication.processEvents()  # its answer, queued to the GUI thread
    assert all(i.model.path != folder for i in manager.items)
