"""One-click calibration: ``seqmoe calibrate`` as a child process, its progress read, Cancel
stopping it, and the predictor found afterwards."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from seqmoe_chat.models.calibration_job import CANCELLED, DONE, FAILED, RUNNING, CalibrationRunner
from seqmoe_chat.models.predictor_state import predictor_state

CHAT = "\n\n".join(
    f"Hello, tell me about topic {i}.\nTopic {i} is a fine subject with many parts.\nWhat else is there to say?"
    for i in range(8)
)


@pytest.fixture
def quick(tmp_path: Path) -> CalibrationRunner:
    text = tmp_path / "chat.txt"
    text.write_text(CHAT)
    # Enough epochs that training outlasts several polls (it takes milliseconds per epoch here).
    return CalibrationRunner(extra_args=["--text", str(text), "--epochs", "25", "--device", "cpu"])


def poll_until(runner: CalibrationRunner, done, timeout: float = 240.0) -> list[str]:
    stages = []
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, runner.status
        runner.poll()
        stages.append(runner.status.stage)
        time.sleep(0.1)
    return stages


def test_calibration_reports_progress_and_leaves_a_predictor(quick: CalibrationRunner, tiny_repo: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_repo, tmp_path / "tiny-moe")
    assert not predictor_state(model).calibrated
    status = quick.start(model)
    stages = poll_until(quick, lambda: status.state != RUNNING)
    assert status.state == DONE and status.fraction == 1.0, status.message
    assert any(s.startswith("Tracing routing") for s in stages) and any(s.startswith("Training the predictor") for s in stages)
    assert "predictor saved to" in status.message
    state = predictor_state(model)
    assert state.calibrated and state.summary.startswith("calibrated: validation loss ")
    assert str(state.path).startswith(str(tmp_path / "cache"))  # the user cache folder, here in tmp


def test_calibration_can_be_cancelled(quick: CalibrationRunner, tiny_repo: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_repo, tmp_path / "tiny-moe")
    status = quick.start(model)
    with pytest.raises(RuntimeError, match="is being calibrated"):
        quick.start(model)
    quick.cancel()  # while it starts; it is stopped at once, wherever it is
    assert status.state == CANCELLED and not quick.busy
    assert not predictor_state(model).calibrated


def test_a_crashed_app_leaves_no_calibration_running(quick: CalibrationRunner, tiny_repo: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_repo, tmp_path / "tiny-moe")
    status = quick.start(model)
    poll_until(quick, lambda: status.stage.startswith("Tracing routing"))
    child = quick._child._process
    child.stdin.close()  # what the system does to the pipe when the app dies
    deadline = time.monotonic() + 10
    while child.poll() is None:
        assert time.monotonic() < deadline, "the calibration outlived its parent's pipe"
        time.sleep(0.05)
    assert not predictor_state(model).calibrated


def test_a_refusal_of_the_engine_is_shown_as_its_one_line(tmp_path: Path) -> None:
    refusing = "import sys; print('seqmoe: error: no such model folder: x', file=sys.stderr); sys.exit(2)"
    runner = CalibrationRunner(command=[sys.executable, "-c", refusing])
    status = runner.start(tmp_path / "x")
    poll_until(runner, lambda: status.state != RUNNING)
    assert status.state == FAILED and status.message == "Calibration failed: no such model folder: x"
