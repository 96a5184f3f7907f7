"""Runs the download queue: one child process at a time (``download_job``), its JSON-lines
events read without blocking, stall detection, bounded automatic retries with backoff, and
cancel, resume and discard. No Qt: the GUI calls ``poll`` from a timer."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .child_process import STDOUT, ChildProcess
from .disk_space import check_disk_space
from .download_queue import ACTIVE_STATES, CANCELLED, DONE, FAILED, QUEUED, RUNNING, WAITING, DownloadEntry, DownloadQueue
from .hub_errors import FAILED as FAILED_KIND
from .hub_errors import INVALID, RETRYABLE, STALLED, HubRefusal
from .model_folders import partial_dir, staging_dir, target_dir
from .transfer_rate import TransferRate

DEFAULT_COMMAND = (sys.executable, "-m", "seqmoe_chat.models.download_job")
SAVE_INTERVAL_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    stall_s: float = 60.0  # no byte for this long while transferring: stop and try again
    start_s: float = 90.0  # no plan this long after the start (the file listing waits HUB_TIMEOUT_S): the same
    max_attempts: int = 5
    backoff_s: tuple[float, ...] = (5.0, 15.0, 45.0, 120.0)

    def delay(self, attempt: int) -> float:
        return self.backoff_s[min(attempt, len(self.backoff_s)) - 1]


class DownloadRunner:
    def __init__(
        self,
        data_dir: Path,
        command: Sequence[str] = DEFAULT_COMMAND,
        policy: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data_dir = data_dir
        self.queue = DownloadQueue(data_dir)
        self.command = list(command)
        self.policy = policy
        self.clock = clock
        self._save_problem = ""
        self.finished: list[DownloadEntry] = []  # completed since the GUI last took them
        self._active: tuple[DownloadEntry, ChildProcess] | None = None
        self._transferring = False
        self._last_bytes_at = 0.0
        self._started_at: float | None = None  # until the child's plan arrives
        self._last_save = 0.0
        self._error: tuple[str, str] | None = None
        self._stderr_tail = ""
        self._retry_at: dict[str, float] = {}
        self._rates: dict[str, TransferRate] = {}

    @property
    def notice(self) -> str:
        """Why the queue could not be saved lately, else why the stored one could not be used."""
        return self._save_problem or self.queue.notice

    @property
    def entries(self) -> list[DownloadEntry]:
        return self.queue.entries

    @property
    def busy(self) -> bool:
        return self._active is not None or any(e.state in (QUEUED, WAITING) for e in self.entries)

    def enqueue(self, repo_id: str, revision: str = "main", total_bytes: int = 0) -> DownloadEntry:
        """Queue a download; refused at once when the model is already here or cannot fit on the disk."""
        target = target_dir(self.data_dir, repo_id)
        if (target / "config.json").is_file():
            raise HubRefusal(INVALID, f"{repo_id} is already in the library")
        # A folder without config.json is not listed in the library (a delete that failed halfway, say),
        # yet the download would stop on it: name it, so that it can be cleared.
        if target.exists():
            raise HubRefusal(INVALID, f"{target} already exists and is not a model in the library; move or delete it")
        queued = self.queue.get(repo_id)
        if queued is not None and queued.state in ACTIVE_STATES:
            raise HubRefusal(INVALID, f"{repo_id} is already being downloaded (see the Downloads tab)")
        staging = staging_dir(self.data_dir, repo_id)
        kept = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file()) if staging.exists() else 0
        check_disk_space(staging, total_bytes - kept)
        try:
            entry = self.queue.add(repo_id, revision, total_bytes)
        except OSError as error:
            raise HubRefusal(FAILED_KIND, f"the download queue could not be saved: {error.strerror or error}") from None
        self._retry_at.pop(repo_id, None)
        return entry

    def cancel(self, repo_id: str) -> None:
        entry = self.queue.get(repo_id)
        if entry is None or entry.state not in ACTIVE_STATES:
            return
        if self._active is not None and self._active[0] is entry:
            self._active[1].terminate()
            self._active = None
        entry.state, entry.message = CANCELLED, "Cancelled; Resume continues where it stopped"
        self._save()

    def resume(self, repo_id: str) -> None:
        entry = self.queue.get(repo_id)
        if entry is not None and entry.state in (CANCELLED, FAILED):
            entry.state, entry.attempts, entry.message, entry.error_kind = QUEUED, 0, "", ""
            self._save()

    def discard(self, repo_id: str) -> None:
        """Cancel and forget a download with its partial files (never a finished model)."""
        self.cancel(repo_id)
        staging = staging_dir(self.data_dir, repo_id).resolve()
        # Only a folder of .partial's own: an id that names another (".." in a hand-edited queue,
        # or a link out of .partial) must not cost the models beside it.
        if staging.parent == partial_dir(self.data_dir).resolve():
            shutil.rmtree(staging, ignore_errors=True)
        self._drop(lambda entry: entry.repo_id == repo_id)

    def forget_finished(self, folder: Path) -> None:
        """Drop the finished download of ``folder``, a model just deleted."""
        self._drop(lambda entry: entry.state == DONE and Path(entry.path) == folder)

    def _drop(self, gone: Callable[[DownloadEntry], bool]) -> None:
        self.queue.entries = [entry for entry in self.entries if not gone(entry)]
        self._save()

    def speed(self, repo_id: str) -> float:
        rate = self._rates.get(repo_id)
        return rate.bytes_per_s() if rate else 0.0

    def seconds_left(self, entry: DownloadEntry) -> float | None:
        rate = self._rates.get(entry.repo_id)
        return rate.seconds_left(entry.total_bytes - entry.done_bytes) if rate else None

    def poll(self) -> None:
        """Take the child's news, notice a stall or its end, start what is due."""
        now = self.clock()
        if self._active is not None:
            self._follow(now)
        if self._active is None:
            due = next((e for e in self.entries if e.state == QUEUED or (
                e.state == WAITING and self._retry_at.get(e.repo_id, 0.0) <= now)), None)
            if due is not None:
                self._start(due, now)

    def shut_down(self) -> None:
        """Stop the running download; it stays queued and continues at the next start."""
        if self._active is not None:
            entry, child = self._active
            child.terminate()
            self._active = None
            entry.state = QUEUED
            self._save()

    def _start(self, entry: DownloadEntry, now: float) -> None:
        argv = [*self.command, entry.repo_id, "--revision", entry.revision,
                "--staging", str(staging_dir(self.data_dir, entry.repo_id)),
                "--target", str(target_dir(self.data_dir, entry.repo_id))]
        try:
            child = ChildProcess(argv)
        except OSError as error:
            self._fail(entry, FAILED_KIND, f"the download process could not start: {error.strerror or error}", now)
            return
        self._active = (entry, child)
        self._transferring, self._error, self._stderr_tail, self._started_at = False, None, "", now
        entry.state, entry.message = RUNNING, "Starting"
        self._rates[entry.repo_id] = TransferRate()
        self._save()

    def _follow(self, now: float) -> None:
        entry, child = self._active
        # Asked before draining: once the exit status is known, every line is already queued.
        code = child.exit_code()
        for stream, line in child.drain():
            if stream == STDOUT:
                self._on_event(entry, line, now)
            elif line.strip():
                self._stderr_tail = line.strip()
        if entry.state == DONE:
            child.terminate()
            self._active = None
            return
        stalled = self._stall(now)
        if stalled:
            child.terminate()
            self._active = None
            self._fail(entry, STALLED, stalled, now)
            return
        if code is None:
            return
        self._active = None
        if self._error is not None:
            self._fail(entry, *self._error, now)
        else:
            tail = f": {self._stderr_tail}" if self._stderr_tail else ""
            self._fail(entry, FAILED_KIND, f"the download process stopped unexpectedly (exit status {code}){tail}", now)

    def _stall(self, now: float) -> str:
        """Why the child is taken for stuck, or "" while it is not."""
        if self._transferring and now - self._last_bytes_at > self.policy.stall_s:
            return f"no data arrived for {self.policy.stall_s:.0f} s"
        if self._started_at is not None and now - self._started_at > self.policy.start_s:
            return f"the hub did not list the model's files within {self.policy.start_s:.0f} s"
        return ""

    def _on_event(self, entry: DownloadEntry, line: str, now: float) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return  # a stray print of a library; the protocol lines are JSON
        kind = event.get("event")
        if kind in ("plan", "progress"):
            if kind == "plan" or event["done_bytes"] > entry.done_bytes:
                self._last_bytes_at = now
            self._started_at = None
            self._transferring = True
            entry.total_bytes, entry.done_bytes = event["total_bytes"], event["done_bytes"]
            entry.message = "Downloading"
            self._rates[entry.repo_id].add(now, entry.done_bytes)
            if now - self._last_save >= SAVE_INTERVAL_S:
                self._save()
        elif kind == "verifying":
            self._transferring = False  # hashing large files sends no bytes; it is not a stall
            entry.done_bytes, entry.message = entry.total_bytes, "Verifying the files"
        elif kind == "done":
            entry.state, entry.path, entry.message, entry.error_kind = DONE, event["path"], "Downloaded and verified", ""
            self.finished.append(entry)
            self._save()
        elif kind == "error":
            self._error = (event.get("kind", FAILED_KIND), event.get("message", "the download failed"))

    def _fail(self, entry: DownloadEntry, kind: str, message: str, now: float) -> None:
        entry.attempts += 1
        entry.error_kind = kind
        if kind in RETRYABLE and entry.attempts < self.policy.max_attempts:
            delay = self.policy.delay(entry.attempts)
            self._retry_at[entry.repo_id] = now + delay
            entry.state = WAITING
            entry.message = (f"{message}; trying again in {delay:.0f} s "
                             f"(attempt {entry.attempts + 1} of {self.policy.max_attempts})")
        else:
            entry.state = FAILED
            given_up = f" (gave up after {entry.attempts} attempts)" if kind in RETRYABLE else ""
            kept = "; the files downloaded so far are kept" if entry.done_bytes else ""
            entry.message = f"{message}{given_up}{kept}"
        self._save()

    def _save(self) -> None:
        self._last_save = self.clock()
        try:
            self.queue.save()
        except OSError as error:  # a full disk must not stop the app; the queue is saved next time
            self._save_problem = f"The download queue could not be saved: {error.strerror or error}"
        else:
            self._save_problem = ""
