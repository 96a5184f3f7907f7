"""A stop signal (``timeout``, a closed terminal) ends a command as Ctrl+C does: what it was
writing is cleaned up, and it says so in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import pytest

import seqmoe.cli
from seqmoe.cli import main

from .conftest import CHAT_TEXT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="os.kill ends a Windows process outright")

SIGNALS = [signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]


@pytest.mark.parametrize("number", SIGNALS, ids=lambda number: signal.Signals(number).name)
def test_a_stop_signal_ends_a_command_as_ctrl_c_does_and_its_handler_is_restored(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    heard: list[int] = []

    def ours(received: int, frame: FrameType | None) -> None:  # the handler before, which the command must not reach
        heard.append(received)

    def signalled(_args: object) -> int:
        os.kill(os.getpid(), number)
        time.sleep(5)  # the handler runs as the signal arrives, cutting the sleep short
        return 0

    monkeypatch.setitem(seqmoe.cli.COMMANDS, "generate", signalled)
    previous = signal.signal(number, ours)
    try:
        status = main(["generate", "--prompt", "hi"])
        restored = signal.getsignal(number)
    finally:
        signal.signal(number, previous)
    name = signal.Signals(number).name
    assert status == 128 + number and capsys.readouterr().err == f"seqmoe: stopped by {name}\n"
    assert restored is ours and heard == []


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP here")
def test_a_signal_the_command_was_started_to_ignore_stays_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # As under ``nohup``: closing the terminal must not end the command.
    def signalled(_args: object) -> int:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
        return 0

    monkeypatch.setitem(seqmoe.cli.COMMANDS, "generate", signalled)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert main(["generate", "--prompt", "hi"]) == 0
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_sigterm_during_a_trace_leaves_no_half_written_shard(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    text = tmp_path / "long.txt"
    text.write_text("\n\n".join([CHAT_TEXT] * 200))  # minutes of tracing: it is stopped long before the end
    out = tmp_path / "new" / "traces"
    trace = ("import sys, seqmoe.trace\n"
             "seqmoe.trace.SHARD_TOKENS = 1\n"  # a shard per document: the second appears while the trace goes on
             "from seqmoe.cli import main\n"
             "sys.exit(main(sys.argv[1:]))\n")
    argv = ["trace", "--model", str(tiny_models["qwen3_moe"]), "--device", "cpu", "--text", str(text), "--out", str(out)]
    process = subprocess.Popen([sys.executable, "-c", trace, *argv], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out / "shard-00001.safetensors").exists():
            assert process.poll() is None and time.monotonic() < deadline, "the trace never wrote its second shard"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert "seqmoe: stopped by SIGTERM" in err.splitlines()
    assert not (tmp_path / "new").exists()  # its shards removed, and the folders the trace made
