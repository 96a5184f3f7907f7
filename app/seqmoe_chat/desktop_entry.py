"""``seqmoe-chat --install-desktop-entry``: SeqMoE Chat in the Linux desktop's menus and docks.

Writes a freedesktop desktop entry and the icon (every hicolor PNG size and the scalable
SVG) into the user's data folder, ``$XDG_DATA_HOME`` or ``~/.local/share``; the entry
starts the launcher this command runs from. ``--uninstall-desktop-entry`` removes exactly
those files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .app_metadata import APP_ID, APP_TITLE, DISTRIBUTION, ICON_SIZES, icon_png, icon_svg
from .atomic_file import write_text_atomically

# Characters that the desktop entry spec reserves in an Exec argument (they need quotes),
# and those that must be escaped with a backslash inside the quotes.
_RESERVED = frozenset(" \t\n\"'\\><~|&;$*?#()`")
_ESCAPED_IN_QUOTES = frozenset('"`$\\')
_STRING_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def data_home() -> Path:
    """``$XDG_DATA_HOME``, else ``~/.local/share`` (the spec ignores a relative path there)."""
    chosen = os.environ.get("XDG_DATA_HOME", "")
    return Path(chosen) if os.path.isabs(chosen) else Path.home() / ".local" / "share"


def desktop_file(home: Path) -> Path:
    return home / "applications" / f"{APP_ID}.desktop"


def icon_files(home: Path) -> list[Path]:
    """The icon in the user's hicolor theme: one PNG per size in ``ICON_SIZES``, then the SVG."""
    hicolor = home / "icons" / "hicolor"
    sizes = [hicolor / f"{size}x{size}" / "apps" / f"{APP_ID}.png" for size in ICON_SIZES]
    return [*sizes, hicolor / "scalable" / "apps" / f"{APP_ID}.svg"]


def launcher_command() -> list[str]:
    """The command that starts this installation of the app."""
    if getattr(sys, "frozen", False):  # a PyInstaller bundle: its executable is the app
        return [sys.executable]
    # pip puts the gui-script beside this interpreter's other scripts (the venv's bin/, or the
    # user's ~/.local/bin for `pip install --user`).
    for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user"):
        script = Path(sysconfig.get_path("scripts", scheme)) / DISTRIBUTION
        if os.access(script, os.X_OK):
            return [str(script)]
    return [sys.executable, "-m", "seqmoe_chat"]


def entry_text(command: list[str]) -> str:
    exec_line = " ".join(_exec_argument(argument) for argument in command)
    return "\n".join(
        [
            "[Desktop Entry]",
            "Type=Application",
            "Version=1.4",
            f"Name={APP_TITLE}",
            "GenericName=Local AI Chat",
            "Comment=Chat with Mixture-of-Experts language models on your own computer",
            f"Exec={exec_line}",
            f"TryExec={_string_value(command[0])}",
            f"Icon={APP_ID}",
            "Terminal=false",
            "Categories=Science;ArtificialIntelligence;",
            "Keywords=chat;LLM;AI;MoE;mixture of experts;offline;",
            "StartupNotify=true",
            # Qt names the X11 window class after the application name (see application.py).
            f"StartupWMClass={APP_TITLE}",
            "",
        ]
    )


def install(home: Path) -> list[Path]:
    """Copy the icons, then write the entry (a menu that sees the entry finds its icon); returns what was written."""
    written = []
    sources = [*(icon_png(size) for size in ICON_SIZES), icon_svg()]
    for source, target in zip(sources, icon_files(home), strict=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    entry = desktop_file(home)
    # Desktop environments watch applications/ and would read a half-written entry.
    entry.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(entry, entry_text(launcher_command()), mode=0o644)
    written.append(entry)
    _refresh_caches(home)
    return written


def uninstall(home: Path) -> list[Path]:
    """Remove the entry and the icons that `install` writes; returns what was there."""
    removed = []
    for path in [desktop_file(home), *icon_files(home)]:
        if path.exists():
            path.unlink()
            removed.append(path)
    _refresh_caches(home)
    return removed


def run_desktop_entry(action: str) -> int:
    """The command-line flags: ``action`` is ``install`` or ``uninstall``; prints what changed."""
    if sys.platform in ("win32", "darwin"):
        print(
            "seqmoe-chat: desktop entries are for Linux desktops; on Windows and macOS the installer adds the app",
            file=sys.stderr,
        )
        return 2
    home = data_home()
    try:
        changed = install(home) if action == "install" else uninstall(home)
    except OSError as error:
        print(f"seqmoe-chat: cannot {action} the desktop entry: {error}", file=sys.stderr)
        return 1
    if action == "install":
        print(f"installed {desktop_file(home)} and {len(changed) - 1} icon files")
    else:
        print(f"removed {len(changed)} files" if changed else "no desktop entry was installed")
    return 0


def _exec_argument(argument: str) -> str:
    """One argument of the Exec key: quoted when needed, then escaped as the key's string value."""
    if argument and not _RESERVED.intersection(argument):
        quoted = argument
    else:
        quoted = '"' + "".join("\\" + c if c in _ESCAPED_IN_QUOTES else c for c in argument) + '"'
    # "%" starts a field code (%f, %u...); a literal one is doubled.
    return _string_value(quoted.replace("%", "%%"))


def _string_value(text: str) -> str:
    return "".join(_STRING_ESCAPES.get(c, c) for c in text)


def _refresh_caches(home: Path) -> None:
    """Refresh the desktop's caches of these folders with their tools, where both exist.

    A cache is refreshed but never created (as xdg-icon-resource does): without one, menus
    and GTK read the folders themselves, and a cache made here would go stale when another
    app adds its files without the tools. A missing or failing tool changes nothing.
    """
    applications = home / "applications"
    if (applications / "mimeinfo.cache").exists():
        _run_quietly("update-desktop-database", "--quiet", str(applications))
    hicolor = home / "icons" / "hicolor"
    if (hicolor / "icon-theme.cache").exists():
        _run_quietly("gtk-update-icon-cache", "--quiet", "--ignore-theme-index", str(hicolor))


def _run_quietly(tool: str, *arguments: str) -> None:
    path = shutil.which(tool)
    if path is None:
        return
    try:
        subprocess.run([path, *arguments], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
