"""The local library: downloaded models, the Hugging Face cache, imported folders and the
bundled demo; sizes, deletion, import, and each model's predictor state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqmoe import ModelRefused

from seqmoe_chat.models.library import BUNDLED, DOWNLOADED, HUB_CACHE, IMPORTED, Library, LibraryError
from seqmoe_chat.models.model_folders import SOURCE_FILE, target_dir
from seqmoe_chat.models.predictor_state import predictor_state

from .conftest import TINY


def downloaded(data_dir: Path, tiny_repo: Path) -> Path:
    """A model as a finished download leaves it."""
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    (folder / SOURCE_FILE).write_text(json.dumps({"format": "seqmoe-model-source", "version": 1, "repo_id": TINY}))
    return folder


def by_source(library: Library, source: str):
    return [m for m in library.models() if m.source == source]


def test_downloaded_models_are_listed_with_their_size_and_deleted(hub, data_dir: Path, tiny_repo: Path) -> None:
    folder = downloaded(data_dir, tiny_repo)
    library = Library(data_dir)
    (model,) = by_source(library, DOWNLOADED)
    assert model.name == TINY and model.path == folder
    assert model.size_bytes == sum(p.stat().st_size for p in folder.iterdir())
    library.delete(model)
    assert not folder.exists() and not by_source(library, DOWNLOADED)


def test_models_already_in_the_hugging_face_cache_are_listed_and_deleted(hub, data_dir: Path, tiny_repo: Path) -> None:
    from huggingface_hub import hf_hub_download

    for file in tiny_repo.iterdir():
        hf_hub_download(TINY, file.name)
    library = Library(data_dir)
    (model,) = by_source(library, HUB_CACHE)
    assert model.name == TINY and (model.path / "config.json").is_file() and model.size_bytes > 3_000_000
    library.delete(model)
    assert not by_source(library, HUB_CACHE) and not model.path.exists()


def test_a_folder_in_models_that_holds_no_model_is_not_listed(data_dir: Path, tiny_repo: Path) -> None:
    folder = downloaded(data_dir, tiny_repo)
    (folder.parent / "notes").mkdir()
    (folder.parent / "notes" / "notes.txt").write_text("not a model")
    assert [m.path for m in by_source(Library(data_dir), DOWNLOADED)] == [folder]


def test_a_hugging_face_cache_snapshot_missing_a_shard_is_not_listed(hub, data_dir: Path, tiny_repo: Path) -> None:
    from huggingface_hub import hf_hub_download

    last, *others = sorted(tiny_repo.glob("*.safetensors"))
    for file in tiny_repo.iterdir():
        if file != last:
            hf_hub_download(TINY, file.name)
    assert others and not by_source(Library(data_dir), HUB_CACHE)  # interrupted before the last shard
    hf_hub_download(TINY, last.name)
    assert [m.name for m in by_source(Library(data_dir), HUB_CACHE)] == [TINY]


def test_an_imported_folder_is_checked_listed_and_only_forgotten(data_dir: Path, tiny_repo: Path, dense_repo: Path) -> None:
    library = Library(data_dir)
    model = library.import_folder(tiny_repo)
    assert model.source == IMPORTED and [m.path for m in Library(data_dir).models() if m.source == IMPORTED] == [tiny_repo]
    with pytest.raises(LibraryError, match="already in the library"):
        library.import_folder(tiny_repo)
    with pytest.raises(ModelRefused, match="not a Mixture-of-Experts"):
        library.import_folder(dense_repo)
    library.delete(model)
    assert not by_source(Library(data_dir), IMPORTED) and (tiny_repo / "config.json").is_file()


def test_an_imported_folder_moved_away_since_is_listed_as_missing(data_dir: Path, tiny_repo: Path, tmp_path: Path) -> None:
    mine = shutil.copytree(tiny_repo, tmp_path / "mine")
    Library(data_dir).import_folder(mine)
    shutil.move(mine, tmp_path / "moved")
    (model,) = by_source(Library(data_dir), IMPORTED)
    assert model.path == mine and model.missing and model.size_bytes == 0
    shutil.move(tmp_path / "moved", mine)  # the drive is plugged in again
    assert not by_source(Library(data_dir), IMPORTED)[0].missing


def test_a_model_whose_folder_is_already_gone_is_deleted_without_error(data_dir: Path, tiny_repo: Path) -> None:
    folder = downloaded(data_dir, tiny_repo)
    library = Library(data_dir)
    (model,) = by_source(library, DOWNLOADED)
    shutil.rmtree(folder)  # by hand, after it was listed
    library.delete(model)
    assert not by_source(library, DOWNLOADED)


def test_a_folder_whose_weights_are_not_the_sizes_its_config_gives_is_not_imported(
    data_dir: Path, tiny_repo: Path, tmp_path: Path
) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(tiny_repo, edited)
    config = json.loads((edited / "config.json").read_text())
    config["hidden_size"] *= 2
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelRefused, match="do not have the shapes its config.json gives"):
        Library(data_dir).import_folder(edited)
    assert not by_source(Library(data_dir), IMPORTED)


def test_an_import_or_a_forgetting_that_cannot_be_saved_changes_nothing(data_dir: Path, tiny_repo: Path, monkeypatch) -> None:
    from seqmoe_chat.models import library as library_module

    library = Library(data_dir)
    model = library.import_folder(tiny_repo)

    def full_disk(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(library_module, "write_json", full_disk)
    with pytest.raises(LibraryError, match="could not be saved: No space left on device"):
        library.delete(model)
    assert library.imported == [tiny_repo]  # still listed, as it will be at the next start
    library.imported = []
    with pytest.raises(LibraryError, match="could not be saved"):
        library.import_folder(tiny_repo)
    assert library.imported == []  # not listed: trying again must not say "already in the library"


def test_the_bundled_demo_is_listed_calibrated_and_cannot_be_deleted(data_dir: Path) -> None:
    library = Library(data_dir)
    (demo,) = by_source(library, BUNDLED)
    state = predictor_state(demo.path)
    report = json.loads(state.path.with_suffix(".json").read_text())["report"]
    assert state.calibrated and state.summary.startswith(
        f"calibrated (shipped): validation loss {report['validation_loss']:.3f} after {report['training_tokens']:,} tokens"
    )
    with pytest.raises(LibraryError, match="cannot be deleted"):
        library.delete(demo)


def test_a_model_without_a_predictor_says_so(tiny_repo: Path) -> None:
    assert predictor_state(tiny_repo).summary == "not calibrated"


def test_a_damaged_library_file_is_kept_aside(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "library.json").write_text('{"format": "seqmoe-chat-library", "version": 99}')
    library = Library(data_dir)
    assert library.imported == [] and "version 99" in library.notice and "library.json.broken-" in library.notice


@pytest.mark.parametrize("imported", ["null", "5", '"/models/x"', '["/models/x", null, 3]', "9" * 5000, "[" * 100_000])
def test_a_library_file_this_app_did_not_write_is_kept_aside(data_dir: Path, imported: str) -> None:
    # null and 5 stopped the app at its start; null among the folders was dropped without a word.
    data_dir.mkdir(parents=True)
    (data_dir / "library.json").write_text(f'{{"format": "seqmoe-chat-library", "version": 1, "imported": {imported}}}')
    library = Library(data_dir)
    assert library.imported == [] and library.notice.startswith("The list of imported folders was reset: library.json")
    assert len(list(data_dir.glob("library.json.broken-*"))) == 1
