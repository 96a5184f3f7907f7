"""Calibration of a model's predictor as a child process (``seqmoe calibrate --model PATH``,
through ``calibration_child``, which ends with the app): it reads the progress the command
prints, and Cancel stops it at once. One at a time: it uses every core."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .child_process import STDERR, ChildProcess

CALIBRATE_COMMAND = (sys.executable, "-m", "seqmoe_chat.models.calibration_child")
_PROGRESS = re.compile(r"^(?P<stage>.*?):\s*(?P<percent>\d+)%\|")  # a tqdm line: "Stage:  42%|####  | 42/100 ..."
_ERROR = "seqmoe: error: "

RUNNING = "running"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"


@dataclass
class CalibrationStatus:
    model: Path
    state: str = RUNNING
    stage: str = "Starting"
    fraction: float = 0.0
    message: str = ""


class CalibrationRunner:
    def __init__(self, command: Sequence[str] = CALIBRATE_COMMAND, extra_args: Sequence[str] = ()) -> None:
        self.command = [*command]
        self.extra_args = [*extra_args]
        self.status: CalibrationStatus | None = None
        self._child: ChildProcess | None = None
        self._last_line = ""

    @property
    def busy(self) -> bool:
        return self._child is not None

    def start(self, model: Path) -> CalibrationStatus:
        if self._child is not None and self.status is not None:
            raise RuntimeError(f"{self.status.model.name} is being calibrated; wait for it or cancel it")
        self.status = CalibrationStatus(model)
        self._last_line = ""
        try:
            self._child = ChildProcess([*self.command, "--model", str(model), *self.extra_args])
        except OSError as error:
            self.status.state, self.status.message = FAILED, f"calibration could not start: {error.strerror or error}"
        return self.status

    def cancel(self) -> None:
        if self._child is not None and self.status is not None:
            self._child.terminate()
            self._child = None
            self.status.state, self.status.message = CANCELLED, "Calibration cancelled; nothing was saved"

    def shut_down(self) -> None:
        self.cancel()

    def poll(self) -> bool:
        """Read the child's progress; True when the status changed."""
        if self._child is None or self.status is None:
            return False
        changed = False
        # Asked before draining: once the exit status is known, every line is already queued.
        code = self._child.exit_code()
        for stream, line in self._child.drain():
            if stream != STDERR or not line.strip():
                continue
            progress = _PROGRESS.match(line.strip())
            if progress:
                self.status.stage = progress["stage"].strip()
                self.status.fraction = int(progress["percent"]) / 100
                changed = True
            else:  # a progress bar is no reason to give when the child fails
                self._last_line = line.strip()
        if code is None:
            return changed
        self._child = None
        if code == 0:
            self.status.state, self.status.fraction = DONE, 1.0
            self.status.message = self._last_line or "Calibrated"
        else:
            self.status.state = FAILED
            reason = self._last_line.removeprefix(_ERROR)
            if code < 0:  # a signal (SIGKILL from the out-of-memory killer, mostly): the child could not say why
                killed = f"Calibration was killed (signal {-code}; often out of memory)"
                # Only an error of its own is worth adding: a warning long before the kill is no reason.
                said = self._last_line.startswith(_ERROR)
                self.status.message = f"{killed}: {reason}" if said else killed
            else:
                self.status.message = f"Calibration failed: {reason or f'exit status {code}'}"
        return True
