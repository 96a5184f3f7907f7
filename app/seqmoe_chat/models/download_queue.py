"""The download queue as it is kept on disk (``downloads.json`` in the app's data folder), so
that it survives a restart, a crash or an update of the app."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .hub_check import parse_reference
from .hub_errors import HubRefusal
from .json_file import StoredFileError, read_json_as, write_json

QUEUE_FILE = "downloads.json"
QUEUE_FORMAT = "seqmoe-chat-downloads"
QUEUE_VERSION = 1

QUEUED = "queued"
RUNNING = "running"
WAITING = "waiting"  # for an automatic retry
CANCELLED = "cancelled"
FAILED = "failed"
DONE = "done"
ACTIVE_STATES = (QUEUED, RUNNING, WAITING)
STATES = (*ACTIVE_STATES, CANCELLED, FAILED, DONE)
MAX_BYTES = 2**63  # what a file offset holds; a larger count is no download's


@dataclass
class DownloadEntry:
    repo_id: str
    revision: str = "main"
    state: str = QUEUED
    total_bytes: int = 0
    done_bytes: int = 0
    message: str = ""
    error_kind: str = ""
    attempts: int = 0  # automatic tries since the person last started or resumed it
    path: str = ""  # the finished folder
    added: float = field(default_factory=time.time)

    @classmethod
    def from_dict(cls, values: object) -> DownloadEntry:
        """An entry as the queue stores it; ``ValueError`` for anything else (a hand edit, say): its
        id names the folders that Remove deletes, and the Downloads tab computes with its counts."""
        if not isinstance(values, dict) or "repo_id" not in values:
            raise ValueError(f"{values!r:.80} is not a download")
        known = {f.name for f in fields(cls)}
        for key, value in values.items():
            if key in known and not _VALID[key](value):
                raise ValueError(f'"{key}" is {value!r:.80}')
        return cls(**{key: value for key, value in values.items() if key in known})


def _is_repo_id(value: object) -> bool:
    """An id the hub field accepts as typed: never ``..``, ``.`` or a path, which would name a
    folder outside the download's own."""
    try:
        return isinstance(value, str) and parse_reference(value).repo_id == value
    except HubRefusal:
        return False


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_BYTES


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_VALID: dict[str, Callable[[object], bool]] = {
    "repo_id": _is_repo_id, "revision": _is_text, "state": lambda value: value in STATES,
    "total_bytes": _is_count, "done_bytes": _is_count, "message": _is_text, "error_kind": _is_text,
    "attempts": _is_count, "path": _is_text, "added": _is_time,
}
"""What each stored field of an entry may hold."""


def _entries(stored: dict[str, Any]) -> list[DownloadEntry]:
    entries = stored.get("entries", [])
    if not isinstance(entries, list):
        raise ValueError(f'"entries" is {entries!r:.80}, not a list')
    return [DownloadEntry.from_dict(values) for values in entries]


class DownloadQueue:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / QUEUE_FILE
        self.notice = ""  # why the stored queue could not be used, if it could not
        self.entries: list[DownloadEntry] = []
        try:
            stored = read_json_as(self.path, QUEUE_FORMAT, QUEUE_VERSION, _entries) or []
        except StoredFileError as error:
            self.notice = f"The download queue was reset: {error}"
            stored = []
        for entry in stored:
            if entry.state in (RUNNING, WAITING):
                # The app stopped while it ran: its files are kept, so it continues where it was.
                entry.state, entry.attempts = QUEUED, 0
            if entry.state == DONE and not Path(entry.path).is_dir():
                continue  # the model was deleted since: "Downloaded and verified" would point at nothing
            self.entries.append(entry)

    def get(self, repo_id: str) -> DownloadEntry | None:
        return next((e for e in self.entries if e.repo_id == repo_id), None)

    def add(self, repo_id: str, revision: str, total_bytes: int = 0) -> DownloadEntry:
        """Queue ``repo_id`` (again); raises ``OSError`` if that cannot be saved, and then nothing changed."""
        previous = self.get(repo_id)
        if previous is None:
            entry = DownloadEntry(repo_id, revision, total_bytes=total_bytes)
            entries = [*self.entries, entry]
        else:
            entry = replace(previous, revision=revision, state=QUEUED, attempts=0, message="", error_kind="",
                            total_bytes=total_bytes or previous.total_bytes)
            entries = [entry if e is previous else e for e in self.entries]
        self._write(entries)
        self.entries = entries
        return entry

    def save(self) -> None:
        self._write(self.entries)

    def _write(self, entries: list[DownloadEntry]) -> None:
        write_json(self.path, QUEUE_FORMAT, QUEUE_VERSION, {"entries": [asdict(e) for e in entries]})
