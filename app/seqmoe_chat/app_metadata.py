"""Who the app is: its name, identifier, version and icon files.

One source for the Qt application, the Linux desktop entry, the icon generator and the
bundles. The version is the one in ``pyproject.toml``, read from the installed metadata
(PyInstaller bundles ship that metadata too).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

DISTRIBUTION = "seqmoe-chat"
APP_TITLE = "SeqMoE Chat"
# Reverse-DNS, as freedesktop and Apple ask: the desktop entry's file name, the icon name,
# the Wayland app id and the macOS bundle identifier.
APP_ID = "io.github.seqmoe.SeqMoEChat"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICON_STEM = "seqmoe-chat"


def app_version() -> str:
    return version(DISTRIBUTION)


def icons_dir() -> Path:
    # Imported here: `seqmoe` loads PyTorch, which the headless commands (and `--version`) never need.
    from seqmoe.resources import resources_dir

    return resources_dir() / "icons"


def icon_svg() -> Path:
    return icons_dir() / f"{ICON_STEM}.svg"


def icon_png(size: int) -> Path:
    return icons_dir() / f"{ICON_STEM}-{size}.png"
