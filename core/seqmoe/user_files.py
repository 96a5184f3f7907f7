"""Files the user names on the command line: texts read, and outputs written.

Each failure is one line (``SeqMoEError``), and an output that cannot be written is refused
before the work that produces it (a trace, a training, a bench run of minutes), not after.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from .errors import SeqMoEError


def read_text(path: Path, what: str = "") -> str:
    """A UTF-8 text file (``what`` it is, for the message), without the byte order mark some
    editors write first, or one line saying why not."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise SeqMoEError(f"cannot read {what}{path}: {_reason(error)}") from None


def check_output(path: Path, flag: str, folder: bool = False, suffixes: tuple[str, ...] = ()) -> Path:
    """Refuse ``path`` (given with ``flag``) if a file (or with ``folder``, a folder) cannot be
    written there, or if its name ends in none of ``suffixes`` (when given). The folders it needs
    are made to try, and for a file removed again: its writer makes them when it writes, so a
    command that fails first leaves no empty folders behind."""
    if suffixes and path.suffix.lower() not in suffixes:
        raise SeqMoEError(f"{flag} {path}: give a file name ending in {', '.join(suffixes)}")
    if folder and path.exists() and not path.is_dir():
        raise SeqMoEError(f"{flag} {path} is a file; give a folder")
    if not folder and path.is_dir():
        raise SeqMoEError(f"{flag} {path} is a folder; give a file name")
    where = path if folder else path.parent
    made = missing_folders(where)
    try:
        where.mkdir(parents=True, exist_ok=True)
        # A file made and dropped there: permissions alone miss read-only mounts and /proc-like folders.
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as error:
        blocking = next((folder for folder in (where, *where.parents) if folder.exists()), where)
        reason = f"{blocking} is a file, not a folder" if not blocking.is_dir() else _reason(error)
        raise SeqMoEError(f"{flag} {path}: cannot write in {where}: {reason}") from None
    finally:
        if not folder:
            remove_empty(made)
    return path


@contextmanager
def output_folder(path: Path, flag: str) -> Iterator[Path]:
    """``check_output`` of a folder to write in during the block. If the block fails, the folders
    that check made are removed again where the block left them empty."""
    made = missing_folders(path)
    check_output(path, flag, folder=True)
    try:
        yield path
    except BaseException:
        remove_empty(made)
        raise


def missing_folders(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first."""
    return [folder for folder in (path, *path.parents) if not folder.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) as long as they are empty."""
    for folder in folders:
        if not folder.is_dir():
            continue  # never made: making its parent failed
        try:
            folder.rmdir()
        except OSError:  # not empty: someone else's now
            break


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Writes to ``path`` that fail (a full disk, a folder gone meanwhile) end in one line."""
    try:
        yield
    except (OSError, SafetensorError) as error:
        raise SeqMoEError(f"cannot write {path}: {_reason(error)}") from None


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A file beside ``path`` to write in the block, moved over ``path`` when the block ends and
    removed if it fails: nobody reads ``path`` half written."""
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error)
