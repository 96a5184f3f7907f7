"""Refuse a download the disk cannot hold, before a byte of it is fetched."""

from __future__ import annotations

import shutil
from pathlib import Path

from .hub_errors import DISK_FULL, HubRefusal


def free_bytes(folder: Path) -> int:
    """Free space on the disk that holds ``folder`` (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(Path.cwd()).free


def check_disk_space(folder: Path, needed: int) -> None:
    free = free_bytes(folder)
    if needed > free:
        raise HubRefusal(
            DISK_FULL,
            f"not enough disk space: {needed / 1e9:.2f} GB still to download, {free / 1e9:.2f} GB free at {folder}; "
            "free some space, then resume",
        )
