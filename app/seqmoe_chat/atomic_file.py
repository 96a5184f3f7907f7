"""Replacing a file so that nobody ever reads it half written."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path``; on any failure the temporary file is removed and ``path`` is left as it was.
    ``mode`` sets the permissions (a temporary file is private to its owner). The folder must
    exist: whether to create it is the caller's choice (an export to a missing folder is an error)."""
    path = Path(path)
    # Not named after ``path``: a name near the file system's 255-byte limit would push it over.
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".seqmoe-chat-", suffix=".tmp")
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


def ordinary_file_mode(path: Path) -> int:
    """The permissions a plain ``open(path, "w")`` would leave: an existing file's own, else
    those the user's umask gives a new file."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it; put back at once
        os.umask(umask)
        return 0o666 & ~umask
