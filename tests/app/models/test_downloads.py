"""Downloads through the queue and its child processes, against the stand-in hub: a full
download, cancel and resume, a dropped connection, a restart of the app, a stall, a gated
model, a full disk."""

from __future__ import annotations

import errno
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from seqmoe_chat.models.download_queue import CANCELLED, DONE, FAILED, QUEUED, RUNNING, WAITING, DownloadEntry, DownloadQueue
from seqmoe_chat.models.download_runner import DownloadRunner, RetryPolicy
from seqmoe_chat.models.hub_check import save_token
from seqmoe_chat.models.hub_errors import DISK_FULL, GATED, INVALID, HubRefusal
from seqmoe_chat.models.json_file import write_json
from seqmoe_chat.models.model_folders import SOURCE_FILE, SOURCE_FORMAT, SOURCE_VERSION, staging_dir, target_dir

from .conftest import GATED as GATED_REPO
from .conftest import TINY
from .hub_server import TOKEN

FAST_RETRY = RetryPolicy(stall_s=60.0, max_attempts=3, backoff_s=(0.1,))


def run_until(runner: DownloadRunner, done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, [(e.state, e.message) for e in runner.entries]
        runner.poll()
        time.sleep(0.05)


def finished(runner: DownloadRunner, repo_id: str) -> Callable[[], bool]:
    return lambda: runner.queue.get(repo_id).state in (DONE, FAILED)


def largest_shard(tiny_repo: Path) -> str:
    """Over 1 MiB: the download process has written part of it when the server fails at 90%."""
    return max(tiny_repo.glob("*.safetensors"), key=lambda p: p.stat().st_size).name


def assert_same_files(folder: Path, repo: Path) -> None:
    for file in repo.iterdir():
        assert (folder / file.name).read_bytes() == file.read_bytes(), file.name


def transferred(runner: DownloadRunner, repo_id: str) -> Callable[[], bool]:
    """Every byte is in: the process verifies (or has failed). Tests that need no more stop here,
    sparing the loader's checks (they import PyTorch)."""
    entry = runner.queue.get(repo_id)
    return lambda: entry.state in (DONE, FAILED) or entry.message == "Verifying the files"


def test_full_download_survives_a_dropped_connection_and_lands_verified(hub, data_dir: Path, tiny_repo: Path) -> None:
    shard = largest_shard(tiny_repo)
    hub.drop_once.add(shard)  # the server closes the connection at 90% of this file, once
    runner = DownloadRunner(data_dir, policy=FAST_RETRY)
    entry = runner.enqueue(TINY)
    with pytest.raises(HubRefusal, match="already being downloaded"):
        runner.enqueue(TINY)
    run_until(runner, finished(runner, TINY))
    assert entry.state == DONE, entry.message
    assert Path(entry.path) == target_dir(data_dir, TINY) and not staging_dir(data_dir, TINY).exists()
    assert_same_files(target_dir(data_dir, TINY), tiny_repo)
    assert entry.done_bytes == entry.total_bytes > 0 and runner.finished == [entry] and entry.attempts == 0
    gets = [r for r in hub.file_requests(shard) if r.method == "GET"]
    assert len(gets) == 2 and "range" not in gets[0].headers and gets[1].headers["range"].startswith("bytes=")
    assert json.loads((data_dir / "downloads.json").read_text())["entries"][0]["state"] == DONE
    with pytest.raises(HubRefusal) as again:
        runner.enqueue(TINY)
    assert again.value.kind == INVALID and "already in the library" in str(again.value)


def test_cancel_stops_at_once_and_a_restart_resumes_from_the_kept_bytes(hub, data_dir: Path, tiny_repo: Path) -> None:
    hub.chunk_delay_s = 0.02
    # The largest shard hangs at 90% the first time: the cancel comes in the middle of it, however
    # late a busy machine sees its first MiB written.
    shard = largest_shard(tiny_repo)
    hub.stall_once[shard] = 30.0
    runner = DownloadRunner(data_dir, policy=FAST_RETRY)
    entry = runner.enqueue(TINY)
    part = staging_dir(data_dir, TINY) / f"{shard}.part"
    run_until(runner, lambda: part.is_file() and part.stat().st_size > 0)
    runner.cancel(TINY)
    hub.stall_once.clear()
    assert entry.state == CANCELLED and "Resume" in entry.message
    kept = part.stat().st_size
    time.sleep(0.5)
    assert part.stat().st_size == kept  # the process is gone: nothing writes any more
    runner.resume(TINY)
    run_until(runner, lambda: entry.done_bytes > kept + 2**20)
    runner.shut_down()  # the app quits with the download running
    hub.chunk_delay_s = 0.0
    restarted = DownloadRunner(data_dir, policy=FAST_RETRY)  # the app starts again
    entry = restarted.queue.get(TINY)
    assert entry.state == QUEUED and entry.done_bytes > 0
    run_until(restarted, finished(restarted, TINY))
    assert entry.state == DONE, entry.message
    assert_same_files(target_dir(data_dir, TINY), tiny_repo)
    ranges = [r.headers.get("range") for r in hub.file_requests(shard) if r.method == "GET"]
    assert ranges[0] is None and ranges[1] == f"bytes={kept}-"


def test_a_crashed_app_leaves_no_download_running(hub, data_dir: Path) -> None:
    hub.chunk_delay_s = 0.05
    runner = DownloadRunner(data_dir, policy=FAST_RETRY)
    entry = runner.enqueue(TINY)
    run_until(runner, lambda: entry.total_bytes > 0)
    child = runner._active[1]
    child._process.stdin.close()  # what the system does to the pipe when the app dies
    deadline = time.monotonic() + 10
    while child._process.poll() is None:
        assert time.monotonic() < deadline, "the child outlived its parent's pipe"
        time.sleep(0.05)
    assert DownloadRunner(data_dir).queue.get(TINY).state == QUEUED


def test_a_download_moved_into_place_as_the_app_quit_is_done_at_the_next_start(hub, data_dir: Path, tiny_repo: Path) -> None:
    queue = DownloadQueue(data_dir)
    queue.add(TINY, "main").state = RUNNING
    queue.save()
    # What the download process leaves after its last step, the move; its "done" was never read.
    folder = shutil.copytree(tiny_repo, target_dir(data_dir, TINY))
    write_json(folder / SOURCE_FILE, SOURCE_FORMAT, SOURCE_VERSION,
               {"repo_id": TINY, "revision": "main", "commit": "c" * 40, "completed": "2025-01-01T00:00:00+0000"})
    runner = DownloadRunner(data_dir, policy=FAST_RETRY)
    entry = runner.queue.get(TINY)
    run_until(runner, finished(runner, TINY))
    assert entry.state == DONE and entry.attempts == 0 and Path(entry.path) == folder, entry.message
    assert runner.finished == [entry] and not hub.requests


def test_a_stalled_transfer_is_stopped_and_retried(hub, data_dir: Path, tiny_repo: Path) -> None:
    hub.stall_once[largest_shard(tiny_repo)] = 20.0
    runner = DownloadRunner(data_dir, policy=RetryPolicy(stall_s=1.5, max_attempts=3, backoff_s=(0.1,)))
    entry = runner.enqueue(TINY)
    messages: list[str] = []
    run_until(runner, lambda: messages.append(entry.message) or transferred(runner, TINY)())
    assert entry.state != FAILED, entry.message
    assert any("no data arrived for 2 s" in m and "attempt 2 of 3" in m for m in messages), set(messages)
    runner.cancel(TINY)


def test_a_download_whose_file_listing_never_comes_is_stopped_and_retried(hub, data_dir: Path) -> None:
    hub.listing_delay_s = 5.0
    runner = DownloadRunner(data_dir, policy=RetryPolicy(start_s=1.0, max_attempts=3, backoff_s=(10.0,)))
    entry = runner.enqueue(TINY)
    run_until(runner, lambda: entry.state == WAITING, timeout=20.0)
    assert entry.message.startswith("the hub did not list the model's files within 1 s; trying again"), entry.message
    runner.cancel(TINY)


def test_a_gated_model_is_refused_then_downloaded_with_a_token(hub, data_dir: Path, tmp_path: Path) -> None:
    runner = DownloadRunner(data_dir, policy=FAST_RETRY)
    entry = runner.enqueue(GATED_REPO)
    run_until(runner, finished(runner, GATED_REPO))
    assert entry.state == FAILED and entry.error_kind == GATED and entry.attempts == 1, entry.message
    assert "accept its licence" in entry.message and "files downloaded so far" not in entry.message  # none were
    save_token(TOKEN)
    assert (tmp_path / "hf-home" / "token").read_text().strip() == TOKEN  # huggingface_hub's own store, in tmp
    runner.resume(GATED_REPO)
    run_until(runner, transferred(runner, GATED_REPO))
    assert entry.state != FAILED, entry.message
    weights = hub.file_requests(".safetensors")
    assert weights and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in weights)
    runner.cancel(GATED_REPO)


def test_a_disk_that_fills_up_fails_clearly_and_keeps_the_files(hub, data_dir: Path) -> None:
    wrapper = [sys.executable, str(Path(__file__).with_name("enospc_child.py"))]
    runner = DownloadRunner(data_dir, command=wrapper, policy=FAST_RETRY)
    entry = runner.enqueue(TINY)
    run_until(runner, finished(runner, TINY))
    assert entry.state == FAILED and entry.error_kind == DISK_FULL and entry.attempts == 1, entry.message
    assert "the disk filled up" in entry.message and "free some space" in entry.message
    assert "files downloaded so far are kept" in entry.message
    assert any(p.stat().st_size > 0 for p in staging_dir(data_dir, TINY).iterdir())


def test_too_little_disk_space_is_refused_when_queued(hub, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqmoe_chat.models import disk_space

    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10**6})())
    runner = DownloadRunner(data_dir)
    with pytest.raises(HubRefusal) as refused:
        runner.enqueue(TINY, total_bytes=5 * 10**9)
    assert refused.value.kind == DISK_FULL and "5.00 GB still to download, 0.00 GB free" in str(refused.value)
    assert runner.entries == [] and not hub.requests


def full_disk(*args, **kwargs) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_download_whose_queue_cannot_be_saved_is_not_queued_and_says_why(data_dir: Path, monkeypatch) -> None:
    from seqmoe_chat.models import download_queue

    runner = DownloadRunner(data_dir)
    runner.enqueue(TINY)
    runner.cancel(TINY)
    monkeypatch.setattr(download_queue, "write_json", full_disk)
    for repo_id in (TINY, "seqmoe-tests/other-moe"):  # queued again, and a new one
        with pytest.raises(HubRefusal, match="^the download queue could not be saved: No space left on device$"):
            runner.enqueue(repo_id)
    assert [(e.repo_id, e.state) for e in runner.entries] == [(TINY, CANCELLED)] and not runner.busy
    monkeypatch.setattr(download_queue, "write_json", write_json)
    assert runner.enqueue("seqmoe-tests/other-moe").state == QUEUED  # not "already being downloaded"


def test_the_notice_that_the_queue_could_not_be_saved_goes_once_it_is_saved(data_dir: Path, monkeypatch) -> None:
    from seqmoe_chat.models import download_queue

    runner = DownloadRunner(data_dir)
    runner.enqueue(TINY)
    monkeypatch.setattr(download_queue, "write_json", full_disk)
    runner.cancel(TINY)
    assert runner.notice == "The download queue could not be saved: No space left on device"
    monkeypatch.setattr(download_queue, "write_json", write_json)
    runner.resume(TINY)
    assert runner.notice == ""
    monkeypatch.setattr(download_queue, "write_json", full_disk)
    runner.discard(TINY)  # Remove on a full disk: gone from the tab, and said; no traceback
    assert runner.entries == [] and runner.notice == "The download queue could not be saved: No space left on device"


def test_a_damaged_queue_file_is_kept_aside_and_reported(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "downloads.json").write_text("{ not json")
    runner = DownloadRunner(data_dir)
    assert runner.entries == [] and "downloads.json.broken-" in runner.notice
    assert len(list(data_dir.glob("downloads.json.broken-*"))) == 1


def write_queue(data_dir: Path, text: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "downloads.json").write_text(f'{{"format": "seqmoe-chat-downloads", "version": 1, {text}}}')


@pytest.mark.parametrize("entries", [
    '"entries": 5', '"entries": ["x"]', '"entries": [{}]',
    '"entries": [{"repo_id": "a/b", "state": "done", "path": null}]',
    '"entries": [{"repo_id": "a/b", "state": "failed", "done_bytes": "lots", "total_bytes": 10}]',
    '"entries": [{"repo_id": "a/b", "state": "finished"}]',
    '"entries": [], "x": ' + "9" * 5000,
    '"entries": ' + "[" * 100_000,
])
def test_a_queue_file_this_app_did_not_write_is_kept_aside_and_reported(data_dir: Path, entries: str) -> None:
    # Each of these stopped the app at its start, or the Downloads tab when it opened.
    write_queue(data_dir, entries)
    runner = DownloadRunner(data_dir)
    assert runner.entries == [] and "The download queue was reset: downloads.json" in runner.notice
    assert len(list(data_dir.glob("downloads.json.broken-*"))) == 1


@pytest.mark.parametrize("repo_id", ["..", ".", "", "a/../..", "../x", "a/b/c", ".partial", "https://hf.co/a/b", 5])
def test_a_queued_id_that_names_another_folder_is_refused(data_dir: Path, repo_id: object) -> None:
    write_queue(data_dir, f'"entries": [{json.dumps({"repo_id": repo_id, "state": FAILED})}]')
    runner = DownloadRunner(data_dir)
    assert runner.entries == [] and "downloads.json.broken-" in runner.notice


def test_remove_deletes_nothing_outside_the_partial_downloads(data_dir: Path) -> None:
    model = target_dir(data_dir, TINY)
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    staging_dir(data_dir, "other/model").mkdir(parents=True)
    runner = DownloadRunner(data_dir)
    runner.queue.entries = [DownloadEntry(".."), DownloadEntry("other/model")]  # as a queue of an earlier app read it
    runner.discard("..")
    assert (model / "config.json").is_file() and staging_dir(data_dir, "other/model").is_dir()
    runner.discard("other/model")
    assert not staging_dir(data_dir, "other/model").exists() and runner.entries == []


def test_retries_are_bounded(data_dir: Path) -> None:
    runner = DownloadRunner(data_dir, policy=RetryPolicy(max_attempts=2, backoff_s=(0.1,)))
    entry = DownloadEntry("x/y")
    runner._fail(entry, "offline", "the hub cannot be reached", 0.0)
    assert entry.state == "waiting" and "attempt 2 of 2" in entry.message
    runner._fail(entry, "offline", "the hub cannot be reached", 1.0)
    assert entry.state == FAILED and "gave up after 2 attempts" in entry.message
