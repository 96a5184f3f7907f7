"""The app end to end with the real engine: the window on a tiny model, and the self-test
that packagers run (on the bundled demo model when it is there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from seqmoe.resources import demo_model_dir
from tests.core.conftest import without_chat_template

from seqmoe_chat.application import open_context
from seqmoe_chat.main_window import MainWindow
from seqmoe_chat.self_test import run_self_test
from seqmoe_chat.store.records import DONE

from .test_chat import send, stored
from .waits import model_shown

STALL_LIMIT_MS = 250  # the target is 50 ms; this machine is shared, so only gross stalls fail


def window_on(qtbot, data_dir: Path, model: Path) -> MainWindow:
    """The window with ``model`` loaded by the real engine."""
    window = MainWindow(open_context(data_dir), str(model))
    qtbot.addWidget(window)
    window.show()
    window.start()
    qtbot.waitUntil(lambda: model_shown(window), timeout=60_000)
    return window


def test_the_window_chats_with_the_real_engine(qtbot, tiny_model: Path, data_dir: Path) -> None:
    window = window_on(qtbot, data_dir, tiny_model)
    assert window.status.model.text() == "tiny-qwen3-moe" and window.status.device.text() == "cpu"
    for text in ("Hello!", "And a second question?"):
        send(qtbot, window, text)
        qtbot.waitUntil(lambda: not window.session.busy, timeout=60_000)
    thread = window.store.thread(window.session.conversation_id)
    assert [state for _, _, state in stored(window)] == [DONE] * 4
    stats = thread[-1].message.stats
    assert stats["tokens"] > 0 and stats["policy"] == "seqmoe" and thread[-1].message.model_id == "tiny-qwen3-moe"
    assert "tok/s" in list(window.chat.widgets.values())[-1].note.text()
    # The second turn read only what the first reply's KV cache lacked, and the status bar says so.
    assert 0 < stats["reused_prompt_tokens"] < stats["prompt_tokens"]
    assert f"{stats['reused_prompt_tokens']} came with the last reply's cache" in window.status.speed.toolTip()
    print(f"\nreal engine, tiny model: first token {stats['time_to_first_token'] * 1000:.0f} ms, "
          f"{stats['tokens_per_s']:.1f} tok/s, longest GUI stall {stats['gui_stall_ms']:.0f} ms")
    assert stats["gui_stall_ms"] < STALL_LIMIT_MS


def test_self_test_passes_on_the_default_model(tiny_model: Path, tmp_path: Path) -> None:
    untouched = tmp_path / "must-stay-empty"
    model = [] if (demo_model_dir() / "config.json").exists() else ["--model", str(tiny_model)]
    result = subprocess.run(
        [sys.executable, "-m", "seqmoe_chat", "--self-test", *model],
        capture_output=True, text=True, timeout=300, env={**os.environ, "SEQMOE_CHAT_DATA_DIR": str(untouched)},
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("seqmoe-chat self-test: OK: "), result.stdout
    assert not untouched.exists()


def test_self_test_fails_with_one_line_when_the_model_does_not_load(tmp_path: Path, capsys) -> None:
    assert run_self_test(str(tmp_path / "no-such-model")) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("seqmoe-chat self-test: FAILED: the model could not be loaded: ") and "no-such-model" in line


def test_a_model_without_a_chat_template_is_refused_and_the_model_before_stays(
    qtbot, tiny_model: Path, data_dir: Path, tmp_path: Path
) -> None:
    # It loaded, the model before it went, and every message then failed.
    window = window_on(qtbot, data_dir, tiny_model)
    plain = without_chat_template(tiny_model, tmp_path / "plain")
    with qtbot.waitSignal(window.context.client.worker.sig_load_failed, timeout=60_000) as failed:
        window.load_model(str(plain))
    _id, reason, kept = failed.args
    assert "plain has no chat template: it is not made for chat" in reason and kept
    qtbot.waitUntil(lambda: model_shown(window), timeout=10_000)
    assert window.status.model.text() == "tiny-qwen3-moe"
