"""The download of one model, run as a child process so that Cancel stops it at once:

    python -m seqmoe_chat.models.download_job REPO_ID --revision REV --staging DIR --target DIR

It reports on stdout, one JSON object a line: ``plan``, ``progress``, ``verifying``, then
``done`` or ``error`` (with a ``kind`` from ``hub_errors``). Each file is written to
``<staging>/<file>.part`` and kept when the process is stopped, the connection is lost or
the app quits; the next run asks the hub only for the rest (an HTTP Range request).
huggingface_hub's ``http_get`` does the transfer, with its own resume after a dropped
connection within one run; its higher-level downloads are not used because the installed
version deletes their partial file whenever a download stops. Afterwards every file's size
and, for weights, SHA-256 are checked, and the folder must pass the engine loader's checks
before it moves to ``target``.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from .child_process import exit_with_parent
from .disk_space import check_disk_space
from .hub_errors import DISK_FULL, INVALID, NO_WEIGHTS, UNSUPPORTED, VERIFY, HubRefusal, describe
from .json_file import StoredFileError, read_json, write_json
from .model_folders import SOURCE_FILE, SOURCE_FORMAT, SOURCE_VERSION, read_source
from .repo_files import HUB_TIMEOUT_S, INDEX_FILE, RemoteFile, download_set, remote_files, total_size

PROGRESS_INTERVAL_S = 0.25
TRANSFER_CHUNK = 2**20
"""Bytes http_get reads before writing (its default is 10 MiB): finer progress, and less of
a transfer lost when the process is stopped."""
HASH_CHUNK = 4 * 2**20
PART_SUFFIX = ".part"


class Reporter:
    """JSON lines on stdout; progress at most every ``PROGRESS_INTERVAL_S``."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self._last = 0.0

    def send(self, event: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"event": event, **fields}) + "\n")
        self.stream.flush()

    def progress(self, done: int, total: int, file: str, final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self.send("progress", done_bytes=done, total_bytes=total, file=file)


class PartFile:
    """The open ``.part`` file as ``http_get`` sees it; reports progress on every write."""

    def __init__(self, handle: BinaryIO, on_size: Any) -> None:
        self.handle = handle
        self.on_size = on_size

    def write(self, data: bytes) -> int:
        written = self.handle.write(data)
        self.on_size(self.handle.tell())
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def truncate(self, size: int | None = None) -> int:
        # http_get truncates when a server ignores the Range header and sends the whole file.
        result = self.handle.truncate(size)
        self.on_size(self.handle.tell())
        return result


def run(repo_id: str, revision: str, staging: Path, target: Path, report: Reporter, endpoint: str | None = None) -> Path:
    from huggingface_hub import HfApi

    if target.exists():
        if _finished_here(target, repo_id, revision):
            return target  # moved there by a run whose "done" the app did not read (it quit or crashed then)
        raise HubRefusal(INVALID, f"{target} already exists and is not this download; move or delete it, then resume")
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True, timeout=HUB_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - describe() re-raises what it does not know
        raise describe(error, repo_id, revision) from None
    commit = info.sha or revision
    files = remote_files(info.siblings or [])
    staging.mkdir(parents=True, exist_ok=True)
    _start_commit(staging, repo_id, revision, commit, files)
    index = None
    if INDEX_FILE in files:
        try:
            _fetch(repo_id, commit, files[INDEX_FILE], staging, endpoint, lambda size: None)
        except Exception as error:  # noqa: BLE001
            raise describe(error, repo_id, revision) from None
        index = json.loads((staging / INDEX_FILE).read_text(encoding="utf-8"))
    chosen = download_set(files, index)
    if not any(f.is_weights for f in chosen):
        raise HubRefusal(NO_WEIGHTS, f"{repo_id} has no safetensors weights; seqmoe never loads pickle (.bin) files")
    total = total_size(chosen)
    finished = sum(f.size for f in chosen if _complete(staging, f))
    partial = sum(_part(staging, f).stat().st_size for f in chosen if not _complete(staging, f) and _part(staging, f).is_file())
    check_disk_space(staging, total - finished - partial)
    report.send("plan", commit=commit, files=len(chosen), total_bytes=total, done_bytes=finished + partial)
    for file in chosen:
        if _complete(staging, file):
            continue
        base = finished
        try:
            _fetch(repo_id, commit, file, staging, endpoint, lambda size: report.progress(base + size, total, file.path))
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise HubRefusal(
                    DISK_FULL,
                    f"the disk filled up while downloading {file.path}: free some space at {staging}, then resume "
                    f"(the {(base + _part(staging, file).stat().st_size) / 1e9:.2f} GB downloaded so far are kept)",
                ) from None
            raise describe(error, repo_id, revision) from None
        except Exception as error:  # noqa: BLE001
            raise describe(error, repo_id, revision) from None
        finished += file.size
        report.progress(finished, total, file.path, final=True)
    report.send("verifying", total_bytes=total)
    _verify(staging, chosen)
    _check_loadable(staging, repo_id)
    _finish_source(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)
    return target


def _finished_here(target: Path, repo_id: str, revision: str) -> bool:
    """``target`` is this download's result: ``completed`` is written after every check passed."""
    source = read_source(target)
    return source.get("repo_id") == repo_id and source.get("revision") == revision and "completed" in source


def _complete(staging: Path, file: RemoteFile) -> bool:
    path = staging / file.path
    return path.is_file() and path.stat().st_size == file.size


def _part(staging: Path, file: RemoteFile) -> Path:
    return staging / (file.path + PART_SUFFIX)


def _fetch(repo_id: str, commit: str, file: RemoteFile, staging: Path, endpoint: str | None, on_size: Any) -> None:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = _part(staging, file)
    if part.is_file() and part.stat().st_size > file.size:
        part.unlink()  # not a prefix of this file: start again
    with part.open("ab") as handle:
        resume = handle.tell()
        http_get(
            hf_hub_url(repo_id, file.path, revision=commit, endpoint=endpoint),
            PartFile(handle, on_size),
            resume_size=resume,
            headers=build_hf_headers(),
            expected_size=file.size,
        )
    os.replace(part, staging / file.path)


def _start_commit(staging: Path, repo_id: str, revision: str, commit: str, files: dict[str, RemoteFile]) -> None:
    """Files of another commit than ``commit`` (the hub's listing ``files``) may differ from this
    one's, even at the same size: its partial files are dropped, and its finished files unless the
    hub gives a SHA-256 that ``_verify`` will check them against (the weights, kept)."""
    source = staging / SOURCE_FILE
    try:
        previous = read_json(source, SOURCE_FORMAT, SOURCE_VERSION)
    except StoredFileError:
        previous = None
    if previous is not None and previous.get("commit") != commit:
        for path in staging.rglob("*"):
            name = path.relative_to(staging).as_posix()
            remote = files.get(name)
            if path.is_file() and path != source and (remote is None or remote.sha256 is None):
                path.unlink()
    write_json(source, SOURCE_FORMAT, SOURCE_VERSION, {"repo_id": repo_id, "revision": revision, "commit": commit})


def _finish_source(staging: Path) -> None:
    source = staging / SOURCE_FILE
    stored = read_json(source, SOURCE_FORMAT, SOURCE_VERSION) or {}
    body = {key: value for key, value in stored.items() if key not in ("format", "version")}
    write_json(source, SOURCE_FORMAT, SOURCE_VERSION, {**body, "completed": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def _verify(staging: Path, files: Sequence[RemoteFile]) -> None:
    """Sizes of every file and SHA-256 of those the hub gives one for; every bad file is removed
    (so that one retry fetches them all) and named."""
    bad = []
    for file in files:
        path = staging / file.path
        size = path.stat().st_size
        if size != file.size:
            bad.append(f"{file.path} has {size} bytes, the hub lists {file.size}")
        elif file.sha256 is not None and _sha256(path) != file.sha256:
            bad.append(f"{file.path} does not match the hub's checksum")
        else:
            continue
        path.unlink()
    if bad:
        raise HubRefusal(VERIFY, f"{'; '.join(bad)}; {'it' if len(bad) == 1 else 'they'} will be fetched again")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_loadable(staging: Path, repo_id: str) -> None:
    from seqmoe.errors import ModelRefused

    from .folder_check import check_model_folder

    try:
        check_model_folder(staging)
    except ModelRefused as error:
        # The loader names the folder it checked: the staging folder means nothing to the person.
        reason = str(error).replace(str(staging), repo_id).replace(staging.name, repo_id)
        raise HubRefusal(UNSUPPORTED, f"the downloaded model does not open: {reason}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="download_job", description=__doc__.splitlines()[0])
    parser.add_argument("repo_id")
    parser.add_argument("--revision", default="main")
    parser.add_argument("--staging", type=Path, required=True)
    parser.add_argument("--target", type=Path, required=True)
    args = parser.parse_args(argv)
    exit_with_parent()
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # progress goes to stdout as JSON, not as bars on stderr
    constants.DOWNLOAD_CHUNK_SIZE = TRANSFER_CHUNK
    report = Reporter()
    try:
        path = run(args.repo_id, args.revision, args.staging, args.target, report)
    except HubRefusal as refusal:
        report.send("error", kind=refusal.kind, message=str(refusal))
        return 1
    except OSError as error:  # writing the bookkeeping or moving the folder: a full disk, permissions
        refusal = describe(error, args.repo_id, args.revision)
        report.send("error", kind=refusal.kind, message=str(refusal))
        return 1
    report.send("done", path=str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
