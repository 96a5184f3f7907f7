"""`seqmoe-chat --install-desktop-entry` / `--uninstall-desktop-entry` into a temporary XDG_DATA_HOME."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from seqmoe_chat import desktop_entry
from seqmoe_chat.app_metadata import APP_ID, APP_TITLE, ICON_SIZES, icon_png, icon_svg
from seqmoe_chat.main import main

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="desktop entries are for Linux desktops")

TOOLS = ("update-desktop-database", "gtk-update-icon-cache")


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary XDG_DATA_HOME, and a PATH with only fake cache tools that log their arguments."""
    home = tmp_path / "xdg-data"
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in TOOLS:
        script = tools / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/tools.log"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.setenv("PATH", str(tools))
    return home


def read_entry(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"))
    assert parser.sections() == ["Desktop Entry"]
    return dict(parser["Desktop Entry"])


def exec_argv(value: str) -> list[str]:
    """The Exec key as the desktop entry spec reads it: string escapes, then quoting, then %%."""
    text = value.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r")
    text = text.replace("\0", "\\")
    argv: list[str] = []
    current, quoted, escaped, started = [], False, False, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted, started = not quoted, True
        elif char == " " and not quoted:
            if started:
                argv.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    assert not quoted and not escaped, f"unbalanced Exec value: {value!r}"
    if started:
        argv.append("".join(current))
    return [argument.replace("%%", "%") for argument in argv]


def test_install_writes_a_valid_entry_and_every_icon(xdg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--install-desktop-entry"]) == 0
    assert "installed" in capsys.readouterr().out
    entry = read_entry(xdg / "applications" / f"{APP_ID}.desktop")
    assert entry["Type"] == "Application"
    assert entry["Name"] == APP_TITLE
    assert entry["Icon"] == APP_ID
    assert entry["StartupWMClass"] == APP_TITLE
    assert entry["Terminal"] == "false"
    categories = entry["Categories"].split(";")
    assert categories[-1] == "" and "Science" in categories  # a main category, and the closing ";"
    launcher = exec_argv(entry["Exec"])
    assert launcher == desktop_entry.launcher_command()
    assert os.access(launcher[0], os.X_OK)
    assert entry["TryExec"] == launcher[0]

    hicolor = xdg / "icons" / "hicolor"
    for size in ICON_SIZES:
        assert (hicolor / f"{size}x{size}" / "apps" / f"{APP_ID}.png").read_bytes() == icon_png(size).read_bytes()
    assert (hicolor / "scalable" / "apps" / f"{APP_ID}.svg").read_bytes() == icon_svg().read_bytes()


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="needs desktop-file-utils")
def test_entry_passes_desktop_file_validate(tmp_path: Path) -> None:
    entry = tmp_path / f"{APP_ID}.desktop"
    entry.write_text(desktop_entry.entry_text(desktop_entry.launcher_command()), encoding="utf-8")
    result = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout


def test_uninstall_removes_exactly_what_was_installed(xdg: Path) -> None:
    others = {
        xdg / "applications" / "other.desktop": b"[Desktop Entry]\nName=Other\n",
        xdg / "icons" / "hicolor" / "48x48" / "apps" / "other.png": b"not ours",
        xdg / "icons" / "hicolor" / "icon-theme.cache": b"a cache",
    }
    for path, content in others.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    before = files_under(xdg)

    assert main(["--install-desktop-entry"]) == 0
    installed = files_under(xdg).keys() - before.keys()
    assert installed == {desktop_entry.desktop_file(xdg), *desktop_entry.icon_files(xdg)}
    assert len(installed) == len(ICON_SIZES) + 2

    assert main(["--uninstall-desktop-entry"]) == 0
    assert files_under(xdg) == before
    assert main(["--uninstall-desktop-entry"]) == 0  # a second time: nothing left to remove, no error


def test_only_existing_caches_are_refreshed(xdg: Path, tmp_path: Path) -> None:
    log = tmp_path / "tools.log"
    desktop_entry.install(xdg)
    assert not log.exists()
    assert not (xdg / "applications" / "mimeinfo.cache").exists()

    (xdg / "applications" / "mimeinfo.cache").write_bytes(b"")
    (xdg / "icons" / "hicolor" / "icon-theme.cache").write_bytes(b"")
    desktop_entry.uninstall(xdg)
    assert log.read_text().splitlines() == [
        f"update-desktop-database --quiet {xdg / 'applications'}",
        f"gtk-update-icon-cache --quiet --ignore-theme-index {xdg / 'icons' / 'hicolor'}",
    ]


def test_missing_or_failing_cache_tools_do_not_fail(xdg: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert main(["--install-desktop-entry"]) == 0
    for tool in TOOLS:
        (tmp_path / "bin" / tool).write_text("#!/bin/sh\nexit 3\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (xdg / "applications" / "mimeinfo.cache").write_bytes(b"")
    (xdg / "icons" / "hicolor" / "icon-theme.cache").write_bytes(b"")
    assert main(["--uninstall-desktop-entry"]) == 0
    assert not desktop_entry.desktop_file(xdg).exists()


def test_exec_quotes_a_bundle_path_with_reserved_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    executable = '/opt/My Apps/100% "$HOME"/back\\slash/seqmoe-chat'
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", executable)
    assert desktop_entry.launcher_command() == [executable]
    text = desktop_entry.entry_text(desktop_entry.launcher_command())
    exec_value = next(line for line in text.splitlines() if line.startswith("Exec="))[len("Exec=") :]
    assert exec_argv(exec_value) == [executable]


def test_relative_xdg_data_home_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "relative/share")
    assert desktop_entry.data_home() == Path.home() / ".local" / "share"


def files_under(folder: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
