"""Replacing a file so that nobody ever reads it half written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path``; on any failure the temporary file is removed and ``path`` is left as it was.
    ``mode`` sets the permissions (a temporary file is private to its owner). The folder must
    exist: whether to create it is the caller's choice (an export to a missing folder is an error)."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
