"""The entry point says what to install when the window cannot open, instead of Qt's abort."""

from __future__ import annotations

import ctypes.util

import pytest

from seqmoe_chat import main as entry


@pytest.fixture
def linux_without_xcb_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry.sys, "platform", "linux")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)


def test_a_missing_x11_cursor_library_is_named_and_the_app_does_not_start(
    linux_without_xcb_cursor: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import seqmoe_chat.application

    monkeypatch.setattr(seqmoe_chat.application, "run_app", lambda *args: pytest.fail("Qt would abort"))
    assert entry.main([]) == 1
    assert "libxcb-cursor0" in capsys.readouterr().err


@pytest.mark.parametrize(("variable", "value"), [("QT_QPA_PLATFORM", "offscreen"), ("WAYLAND_DISPLAY", "wayland-0")])
def test_other_platforms_do_not_need_it(linux_without_xcb_cursor: None, monkeypatch: pytest.MonkeyPatch,
                                        variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    assert entry.display_problem() is None


def test_with_the_library_nothing_is_said(monkeypatch: pytest.MonkeyPatch, linux_without_xcb_cursor: None) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so.0")
    assert entry.display_problem() is None
