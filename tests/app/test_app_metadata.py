"""The app's name, identifier and version agree everywhere: pyproject, Qt, `--version`, the desktop entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seqmoe_chat import desktop_entry
from seqmoe_chat.app_metadata import APP_ID, APP_TITLE, ICON_SIZES, app_version
from seqmoe_chat.application import create_application
from seqmoe_chat.main import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pyproject_version() -> str:
    match = re.search(r'^version = "([^"]+)"$', PYPROJECT.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "no version in pyproject.toml"
    return match.group(1)


def test_runtime_version_is_pyprojects(capsys: pytest.CaptureFixture[str]) -> None:
    assert app_version() == pyproject_version()
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"seqmoe-chat {pyproject_version()}"


def test_qt_application_identity_matches_the_desktop_entry(qapp, tmp_path: Path) -> None:
    app = create_application()
    assert app.applicationVersion() == pyproject_version()
    assert app.applicationDisplayName() == APP_TITLE
    # X11 names the window class after the application name; Wayland uses the desktop file name.
    entry = desktop_entry.entry_text(desktop_entry.launcher_command())
    assert f"StartupWMClass={app.applicationName()}" in entry.splitlines()
    assert desktop_entry.desktop_file(tmp_path).stem == app.desktopFileName() == APP_ID
    icon_sizes = {(size.width(), size.height()) for size in app.windowIcon().availableSizes()}
    assert icon_sizes == {(size, size) for size in ICON_SIZES}
