"""The download queue as it is kept on disk (``downloads.json`` in the app's data folder), so
that it survives a restart, a crash or an update of the app."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .json_file import StoredFileError, read_json, write_json

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
    def from_dict(cls, values: dict[str, Any]) -> DownloadEntry:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


class DownloadQueue:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / QUEUE_FILE
        self.notice = ""  # why the stored queue could not be used, if it could not
        self.entries: list[DownloadEntry] = []
        try:
            stored = read_json(self.path, QUEUE_FORMAT, QUEUE_VERSION)
        except StoredFileError as error:
            self.notice = f"The download queue was reset: {error}"
            stored = None
        for raw in (stored or {}).get("entries", []):
            entry = DownloadEntry.from_dict(raw)
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
