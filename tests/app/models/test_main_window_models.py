"""The main window's way into the model manager: the Model menu and the model toolbar open the
Models window, the library's models join the model selector, and Load there loads them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seqmoe_chat.models.library import Library
from seqmoe_chat.models.model_folders import SOURCE_FILE, target_dir

from ..waits import model_shown
from .conftest import TINY


def test_the_library_joins_the_model_selector_and_loads_from_the_models_window(
    qtbot, make_window, data_dir: Path, tiny_repo: Path, backend
) -> None:
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    (folder / SOURCE_FILE).write_text(json.dumps({"format": "seqmoe-model-source", "version": 1, "repo_id": TINY}))
    window = make_window()
    combo = window.model_bar.models
    qtbot.waitUntil(lambda: combo.findData(str(folder)) >= 0, timeout=30_000)
    assert combo.itemText(combo.findData(str(folder))) == TINY
    assert "&Models…" in [a.text() for a in window.menuBar().actions()[2].menu().actions()]
    window.model_toolbar.widgetForAction(window.action_models).click()
    dialog = window._models_dialog
    qtbot.waitUntil(dialog.isVisible)
    library = dialog.library
    qtbot.waitUntil(lambda: any(i.model.path == folder for i in library.items), timeout=30_000)
    library.select(str(folder))
    library.buttons["Load"].click()
    qtbot.waitUntil(lambda: model_shown(window) and window.client.model.path.endswith(folder.name), timeout=10_000)
    assert window.settings.model == str(folder)
    window.action_models.trigger()  # the menu opens the same window again
    assert window._models_dialog is dialog and dialog.isVisible()


def test_an_imported_folder_moved_away_is_not_offered_for_loading(
    qtbot, make_window, data_dir: Path, tiny_repo: Path, tmp_path: Path
) -> None:
    mine = shutil.copytree(tiny_repo, tmp_path / "mine")
    Library(data_dir).import_folder(mine)
    shutil.move(mine, tmp_path / "moved")
    window = make_window()
    window.action_models.trigger()
    library = window._models_dialog.library
    qtbot.waitUntil(lambda: any(i.model.path == mine for i in library.items), timeout=30_000)
    assert window.model_bar.models.findData(str(mine)) < 0
    library.select(str(mine))
    row = library.table.currentRow()
    assert library.table.item(row, 2).text() == "folder missing"
    assert not library.buttons["Load"].isEnabled() and library.buttons["Delete…"].isEnabled()
