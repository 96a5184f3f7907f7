"""Whether an export may write PATH (``seqmoe-chat export --out PATH``, or the window's choice).

The window's save dialog asks before it replaces a file; the command cannot ask, so it replaces
only a file it is told to (``--force``). The export is written to a temporary file renamed over
PATH, which would put a plain file in the place of a link, a named pipe or a device, and which
once replaced the chat database itself: those are refused even with ``--force``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .store.database import database_files

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def refusal(path: Path, database: Path, force: bool) -> str | None:
    """Why the export must not be written to ``path``, or ``None`` when it may."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None  # nothing there (or out of reach: the write says why)
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link; give the file it points to, or another name"
    if any(_same_file(path, own) for own in database_files(database)):
        return f"{path} is a file of the chat database; choose another name"
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "something other than a file")
        return f"{path} is {kind}, not a file; choose another name"
    if not force:
        return f"{path} exists; add --force to replace it"
    return None


def _same_file(path: Path, other: Path) -> bool:
    """Also under another spelling of its name, or a hard link's. The command holds the database
    open, so its log and shared memory files are there too."""
    try:
        return os.path.samefile(path, other)
    except OSError:  # gone meanwhile
        return False
