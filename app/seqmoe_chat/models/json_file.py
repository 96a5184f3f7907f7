"""The model manager's small JSON files (the download queue, imported folders).

Written to a temporary file in the same folder and renamed over the old one (as calibre
does), so a crash or a full disk leaves the old file or the new one, never half of one.
Each file carries a format name and a schema version; a file that cannot be read is kept
aside under another name, never overwritten.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..atomic_file import write_text_atomically

T = TypeVar("T")


class StoredFileError(Exception):
    """A stored file could not be used; the message says where its content was kept."""


def write_json(path: Path, fmt: str, version: int, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps({"format": fmt, "version": version, **body}, indent=1))


def read_json(path: Path, fmt: str, version: int) -> dict[str, Any] | None:
    """The file's content (None if there is no file yet). A damaged file, or one written by
    a newer version of the app, is renamed aside and reported with ``StoredFileError``."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    # ValueError: bad UTF-8, bad JSON, or an integer of over 4,300 digits; RecursionError: nesting
    # deeper than the parser goes. Each is a damaged file, not a reason for the app to stop.
    except (OSError, ValueError, RecursionError) as error:
        raise StoredFileError(f"{path.name} could not be read ({error}); {set_aside(path)}") from None
    if not isinstance(value, dict) or value.get("format") != fmt:
        raise StoredFileError(f"{path.name} is not a {fmt} file; {set_aside(path)}")
    if value.get("version") != version:
        raise StoredFileError(
            f"{path.name} has version {value.get('version')!r}, this app reads version {version}; {set_aside(path)}"
        )
    return value


def read_json_as(path: Path, fmt: str, version: int, parse: Callable[[dict[str, Any]], T]) -> T | None:
    """``parse`` of the file's content (None if there is no file yet). ``parse`` raises
    ``ValueError`` for content this app does not write (a hand edit, say): the file is then set
    aside as a damaged one is, before any of it is used."""
    stored = read_json(path, fmt, version)
    if stored is None:
        return None
    try:
        return parse(stored)
    except ValueError as error:
        raise StoredFileError(f"{path.name} is not as this app writes it ({error}); {set_aside(path)}") from None


def broken_name(path: Path) -> Path:
    """Where a file of the app's that it cannot use is kept: beside it, named for the time."""
    return path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")


def set_aside(path: Path) -> str:
    """Rename ``path`` aside, where nothing overwrites it; says where it went, for a message."""
    kept = broken_name(path)
    try:
        os.replace(path, kept)
    except OSError as error:
        return f"it could not be renamed aside either ({error.strerror or error})"
    return f"it was kept as {kept.name} and a new one was started"
