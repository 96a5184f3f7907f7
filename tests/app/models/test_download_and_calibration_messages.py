"""What a failed calibration or download says: a child killed by a signal, a folder in the way
of a download, a connection reset in the middle of a file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx2
import pytest

from seqmoe_chat.models.calibration_job import FAILED, RUNNING, CalibrationRunner
from seqmoe_chat.models.download_runner import DownloadRunner
from seqmoe_chat.models.hub_errors import INVALID, OFFLINE, RETRYABLE, HubRefusal, describe
from seqmoe_chat.models.model_folders import target_dir

# A calibration child that the out-of-memory killer stops in the middle of training.
KILLED = """
import os, signal, sys
{before}
print('Training the predictor (epoch 3):  42%|####  | 42/100', file=sys.stderr, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a signal ends a child on POSIX systems only")
@pytest.mark.parametrize("before, kept", [
    ("", None),
    ("print('seqmoe: error: the predictor could not be saved', file=sys.stderr, flush=True)",
     "the predictor could not be saved"),
    ("print('UserWarning: a library said something', file=sys.stderr, flush=True)", None),
], ids=["silent", "after-an-error-line", "after-a-warning"])
def test_a_calibration_killed_by_a_signal_says_so_not_its_progress_bar(tmp_path: Path, before: str, kept: str | None) -> None:
    runner = CalibrationRunner(command=[sys.executable, "-c", KILLED.format(before=before)])
    status = runner.start(tmp_path / "model")
    deadline = time.monotonic() + 60
    while status.state == RUNNING:
        assert time.monotonic() < deadline, status
        runner.poll()
        time.sleep(0.02)
    assert status.state == FAILED and status.stage == "Training the predictor (epoch 3)"
    assert status.message.startswith("Calibration was killed (signal 9; often out of memory)")
    assert "42%" not in status.message
    if kept:
        assert status.message.endswith(f": {kept}")
    else:
        assert status.message == "Calibration was killed (signal 9; often out of memory)"


def test_a_leftover_folder_without_a_model_is_named_not_called_in_the_library(data_dir: Path) -> None:
    leftover = target_dir(data_dir, "owner/model")
    leftover.mkdir(parents=True)
    (leftover / "model-00001-of-00002.safetensors").write_bytes(b"x")  # what a delete that failed halfway leaves
    with pytest.raises(HubRefusal) as refused:
        DownloadRunner(data_dir).enqueue("owner/model")
    assert refused.value.kind == INVALID
    assert str(refused.value) == f"{leftover} already exists and is not a model in the library; move or delete it"

    (leftover / "config.json").write_text("{}")
    with pytest.raises(HubRefusal, match="owner/model is already in the library"):
        DownloadRunner(data_dir).enqueue("owner/model")


def test_a_connection_reset_in_the_middle_of_a_file_is_a_network_problem_worth_a_retry() -> None:
    refusal = describe(httpx2.ReadError("[Errno 104] Connection reset by peer"), "owner/model")
    assert refusal.kind == OFFLINE and refusal.kind in RETRYABLE
    assert str(refusal).startswith("the Hugging Face hub cannot be reached")
