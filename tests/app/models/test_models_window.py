"""The Models window with pytest-qt: the catalog with fit labels, offline notes, a hub id
checked and downloaded with visible progress, the library, deletion and calibration."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QPushButton

from seqmoe_chat.model_manager import catalog_tab, prompts
from seqmoe_chat.model_manager.catalog_tab import COLUMNS
from seqmoe_chat.model_manager.dialog import ModelsDialog
from seqmoe_chat.model_manager.manager import ModelManager
from seqmoe_chat.models.calibration_job import CalibrationRunner
from seqmoe_chat.models.download_queue import DONE
from seqmoe_chat.models.download_runner import DownloadRunner, RetryPolicy
from seqmoe_chat.models.fit import DeviceMemory
from seqmoe_chat.models.library import DOWNLOADED
from seqmoe_chat.models.model_folders import target_dir

from .conftest import DENSE, TINY

GIB = 2**30
RTX_4090 = DeviceMemory("cuda", "Test GPU", 24 * GIB, 64 * GIB, 4096)
# Prints progress as `seqmoe calibrate` does (tqdm lines on stderr), then its last line.
FAKE_CALIBRATE = (
    "import sys, time\n"
    "for p in (10, 50, 90):\n"
    "    print(f'Training the predictor (epoch {p}):  {p}%|###   | {p}/100', file=sys.stderr, flush=True); time.sleep(0.2)\n"
    "print('calibrated in 1 s of training: validation loss 0.2000; predictor saved to x', file=sys.stderr)\n"
)


@pytest.fixture
def window(qtbot, data_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(catalog_tab, "probe_device", lambda budget, context: RTX_4090)

    def make(**manager_options) -> ModelsDialog:
        downloads = DownloadRunner(data_dir, policy=RetryPolicy(backoff_s=(0.1,)))
        manager = ModelManager(data_dir, downloads=downloads, **manager_options)
        dialog = ModelsDialog(manager)
        qtbot.addWidget(dialog)
        manager.start()
        dialog.open_tab()
        return dialog

    return make


def test_the_catalog_lists_every_model_with_what_fits_this_computer(qtbot, window) -> None:
    dialog = window()
    qtbot.waitUntil(lambda: dialog.catalog.table.rowCount() == 10, timeout=30_000)
    labels = dialog.catalog.fit_labels()
    assert labels["OLMoE 1B-7B Instruct"] == "fits entirely"
    assert labels["Qwen3-30B-A3B Instruct 2507"] == "runs with SeqMoE at 37% cached"
    assert labels["Mixtral 8x7B Instruct v0.1"].startswith("too large for this RAM (needs 87.0 GiB")
    # It ships its own code (auto_map) for an architecture transformers has built in: it runs without that code.
    assert labels["DeepSeek-V2-Lite Chat"] == "runs with SeqMoE at 74% cached"
    assert dialog.catalog.device_line.text() == "Test GPU: 24.0 GiB of VRAM free, 64.0 GiB of RAM, a context of 4,096 tokens"
    gpt_oss = next(r for r in range(10) if dialog.catalog.table.item(r, 0).text() == "gpt-oss-20b")
    per_expert = dialog.catalog.table.item(gpt_oss, COLUMNS.index("Per expert"))
    assert per_expert.text() == "49.8 MB" and "13.2 MB as MXFP4 on disk" in per_expert.toolTip()


def test_offline_the_catalog_says_downloads_need_a_connection(qtbot, window) -> None:
    dialog = window()  # the app tests run with HF_HUB_OFFLINE=1
    qtbot.waitUntil(lambda: dialog.catalog.table.rowCount() == 10, timeout=30_000)
    assert "downloads need a connection" in dialog.catalog.connection.text()
    buttons = [dialog.catalog.table.cellWidget(r, 7) for r in range(10)]
    assert all(isinstance(b, QPushButton) and not b.isEnabled() for b in buttons)
    hub = dialog.catalog.hub
    hub.reference.setText("allenai/OLMoE-1B-7B-0924-Instruct")
    hub.check()
    qtbot.waitUntil(lambda: "downloads need a connection" in hub.result.text(), timeout=10_000)
    assert hub.download_button.isHidden()


def test_a_hub_id_is_checked_downloaded_with_progress_and_joins_the_library(qtbot, window, hub, data_dir: Path) -> None:
    hub.chunk_delay_s = 0.01
    dialog = window()
    panel = dialog.catalog.hub
    panel.reference.setText(f"https://huggingface.co/{TINY}")
    panel.check()
    qtbot.waitUntil(lambda: panel.download_button.isVisible(), timeout=30_000)
    assert "Qwen3MoeForCausalLM" in panel.result.text() and "2 MoE layers × 8 experts, top-2" in panel.result.text()
    panel.download_button.click()
    assert dialog.tabs.currentWidget() is dialog.downloads
    row = dialog.downloads.rows[TINY]
    qtbot.waitUntil(lambda: " of " in row.detail.text() and row.progress.value() > 0, timeout=60_000)
    assert "MB" in row.detail.text() and row.cancel_button.isVisible()
    entry = dialog.manager.downloads.queue.get(TINY)
    qtbot.waitUntil(lambda: entry.state == DONE, timeout=120_000)
    qtbot.waitUntil(lambda: dialog.offer_bar.isVisible(), timeout=5_000)
    assert TINY in dialog.offer.text()
    qtbot.waitUntil(lambda: any(i.model.source == DOWNLOADED for i in dialog.library.items), timeout=30_000)
    names = [dialog.library.table.item(r, 0).text() for r in range(dialog.library.table.rowCount())]
    assert TINY in names
    (item,) = [i for i in dialog.library.items if i.model.source == DOWNLOADED]
    assert item.model.path == target_dir(data_dir, TINY) and item.predictor.summary == "not calibrated"


def test_the_library_deletes_after_confirmation_and_reveals_folders(
    qtbot, window, data_dir: Path, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    dialog = window()
    library = dialog.library
    qtbot.waitUntil(lambda: any(i.model.path == folder for i in library.items), timeout=30_000)
    library.select(str(folder))
    revealed: list[Path] = []
    monkeypatch.setattr(prompts, "reveal", lambda path: revealed.append(path) or True)
    library.buttons["Reveal"].click()
    assert revealed == [folder]
    monkeypatch.setattr(prompts, "confirm", lambda *args: False)
    library.buttons["Delete…"].click()
    assert folder.exists()
    monkeypatch.setattr(prompts, "confirm", lambda *args: True)
    library.buttons["Delete…"].click()
    assert not folder.exists() and "deleted" in library.message.text()
    qtbot.waitUntil(lambda: all(i.model.path != folder for i in library.items), timeout=30_000)


def test_an_imported_folder_is_said_added_or_why_not(qtbot, window, tiny_repo: Path, dense_repo: Path, monkeypatch) -> None:
    library = window().library
    monkeypatch.setattr(prompts, "choose_folder", lambda parent: tiny_repo)
    library.import_folder()
    assert library.message.text() == f"Checking {tiny_repo}…"
    qtbot.waitUntil(lambda: library.message.text() == f"{tiny_repo.name} was added to the library.", timeout=30_000)
    qtbot.waitUntil(lambda: any(i.model.path == tiny_repo for i in library.items), timeout=30_000)
    monkeypatch.setattr(prompts, "choose_folder", lambda parent: dense_repo)
    library.import_folder()
    qtbot.waitUntil(lambda: "was not imported" in library.message.text(), timeout=30_000)
    assert "not a Mixture-of-Experts" in library.message.text()


def test_a_deleted_model_leaves_the_model_list_and_is_not_opened_at_the_next_start(
    qtbot, make_window, data_dir: Path, tiny_repo: Path
) -> None:
    folder = str(shutil.copytree(tiny_repo, target_dir(data_dir, TINY)))
    main = make_window()
    main.load_model(folder)  # the fake engine loads any folder
    qtbot.waitUntil(lambda: main.client.model is not None and main.settings.model == folder, timeout=10_000)
    main.client.unload()
    qtbot.waitUntil(lambda: main.client.model is None, timeout=10_000)
    qtbot.waitUntil(lambda: any(str(i.model.path) == folder for i in main.models.items), timeout=30_000)
    main.models.delete(next(i for i in main.models.items if str(i.model.path) == folder))
    bar = main.model_bar
    qtbot.waitUntil(lambda: folder not in [bar.models.itemData(i) for i in range(bar.models.count())], timeout=30_000)
    assert main.settings.recent_models == [] and main.settings.model == "" and bar.chosen_model() == ""
    main.close()
    assert make_window().client.model.name == "seqmoe-demo"


def test_calibration_shows_progress_and_its_result(qtbot, window, data_dir: Path, tiny_repo: Path) -> None:
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    dialog = window(calibration=CalibrationRunner(command=[sys.executable, "-c", FAKE_CALIBRATE]))
    library = dialog.library
    qtbot.waitUntil(lambda: any(i.model.path == folder for i in library.items), timeout=30_000)
    library.select(str(folder))
    library.buttons["Calibrate"].click()
    assert not library.buttons["Cancel calibration"].isHidden() and not library.buttons["Calibrate"].isEnabled()
    qtbot.waitUntil(lambda: library.calibration.value() >= 50, timeout=30_000)
    assert library.calibration_text.text().startswith(f"Calibrating {folder.name}: Training the predictor")
    qtbot.waitUntil(lambda: not dialog.manager.calibration.busy, timeout=30_000)
    assert library.calibration_text.text().startswith("calibrated in 1 s") and library.calibration.isHidden()


def test_a_library_that_could_not_be_listed_says_so_in_a_tab_opened_later(
    qtbot, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_tab, "probe_device", lambda budget, context: RTX_4090)
    manager = ModelManager(data_dir, downloads=DownloadRunner(data_dir))
    listing = manager.library.items
    problems = [OSError("Permission denied: 'models'")]

    def items_once_failing():
        if problems:
            raise problems.pop()
        return listing()

    monkeypatch.setattr(manager.library, "items", items_once_failing)
    manager.refresh_library()  # as at start, before anyone opens the Models window
    qtbot.waitUntil(lambda: manager.library_problem != "", timeout=10_000)
    dialog = ModelsDialog(manager)
    qtbot.addWidget(dialog)
    assert dialog.library.message.text() == "The library could not be listed: Permission denied: 'models'"
    manager.refresh_library()
    qtbot.waitUntil(lambda: dialog.library.table.rowCount() > 0, timeout=30_000)
    assert dialog.library.message.text() == ""


def test_only_the_latest_hub_check_is_shown_and_offered(qtbot, window, hub, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqmoe_chat.model_manager import hub_panel

    real = hub_panel.check_repo

    def slow_for_the_first(reference, *args):  # noqa: ANN001, ANN202
        if reference.repo_id == TINY:
            time.sleep(1.5)
        return real(reference, *args)

    monkeypatch.setattr(hub_panel, "check_repo", slow_for_the_first)
    panel = window().catalog.hub
    panel.reference.setText(TINY)
    panel.check()
    panel.reference.setText(DENSE)  # changed its mind before the first answer came
    panel.check()
    qtbot.waitUntil(lambda: "Checking" not in panel.result.text(), timeout=30_000)
    refusal = panel.result.text()
    qtbot.wait(2500)  # the first check's answer arrives meanwhile
    assert panel.result.text() == refusal and not panel.download_button.isVisible() and panel.model is None


def test_a_model_loading_or_being_calibrated_is_not_deleted(
    qtbot, window, data_dir: Path, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqmoe_chat.models.library import LibraryError

    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    monkeypatch.chdir(folder.parent)
    slow = "import time; time.sleep(30)"
    dialog = window(loaded_path=lambda: f"./{folder.name}", calibration=CalibrationRunner(command=[sys.executable, "-c", slow]))
    manager = dialog.manager
    qtbot.waitUntil(lambda: any(i.model.path == folder for i in manager.items), timeout=30_000)
    (item,) = [i for i in manager.items if i.model.path == folder]
    with pytest.raises(LibraryError, match="loaded or loading"):  # named by a relative path
        manager.delete(item)
    manager.loaded_path = lambda: None
    manager.calibrate(folder)
    with pytest.raises(LibraryError, match="being calibrated"):
        manager.delete(item)
    manager.cancel_calibration()
    assert folder.exists()


def test_after_a_delete_the_library_selects_nothing_else(qtbot, window, data_dir: Path, tiny_repo: Path) -> None:
    first = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    second = shutil.copytree(tiny_repo, target_dir(data_dir, "seqmoe-tests/other-moe"))
    library = window().library
    qtbot.waitUntil(lambda: {first, second} <= {i.model.path for i in library.items}, timeout=30_000)
    library.select(str(first))
    library.show_items([i for i in library.items if i.model.path != first])
    assert library.selected() is None and not library.buttons["Delete…"].isEnabled()


def test_a_damaged_list_of_imported_folders_is_said_in_the_library(qtbot, window, data_dir: Path) -> None:
    from seqmoe_chat.models.library import LIBRARY_FILE

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / LIBRARY_FILE).write_text("{not json")
    library = window().library
    qtbot.waitUntil(lambda: "list of imported folders was reset" in library.message.text(), timeout=30_000)
    assert library.items  # the demo model and the rest are still listed


def test_a_deleted_download_leaves_the_downloads_tab_now_and_after_a_restart(
    qtbot, window, data_dir: Path, tiny_repo: Path
) -> None:
    from seqmoe_chat.models.download_queue import DownloadQueue

    queue = DownloadQueue(data_dir)
    for repo_id in (TINY, "seqmoe-tests/other-moe"):
        entry = queue.add(repo_id, "main")
        entry.state, entry.path = DONE, str(shutil.copytree(tiny_repo, target_dir(data_dir, repo_id)))
    queue.save()
    shutil.rmtree(target_dir(data_dir, "seqmoe-tests/other-moe"))  # by hand, while the app was closed
    dialog = window()
    assert list(dialog.downloads.rows) == [TINY]
    manager = dialog.manager
    qtbot.waitUntil(lambda: any(i.model.path == target_dir(data_dir, TINY) for i in manager.items), timeout=30_000)
    manager.delete(next(i for i in manager.items if i.model.path == target_dir(data_dir, TINY)))
    assert not dialog.downloads.rows and not DownloadQueue(data_dir).entries
