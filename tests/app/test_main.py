"""The entry point names a missing system library when the window cannot open, instead of Qt's abort."""

from __future__ import annotations

import ctypes

import pytest

from seqmoe_chat import main as entry

LOADER_ERROR = "libxcb-icccm.so.4: cannot open shared object file: No such file or directory"


@pytest.fixture
def x11_lacking_icccm(monkeypatch: pytest.MonkeyPatch) -> None:
    def cdll(path: str) -> None:
        raise OSError(LOADER_ERROR)

    monkeypatch.setattr(entry.sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")


def test_a_missing_library_is_named_with_its_package_and_the_app_does_not_start(
    x11_lacking_icccm: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import seqmoe_chat.application

    monkeypatch.setattr(seqmoe_chat.application, "run_app", lambda *args: pytest.fail("Qt would abort"))
    assert entry.main([]) == 1
    err = capsys.readouterr().err
    assert "libxcb-icccm.so.4 is not installed" in err and "sudo apt install libxcb-icccm4" in err


@pytest.mark.parametrize(("variable", "value"), [("QT_QPA_PLATFORM", "offscreen"), ("WAYLAND_DISPLAY", "wayland-0")])
def test_other_platforms_are_not_checked(x11_lacking_icccm: None, monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    assert entry.display_problem() is None


@pytest.mark.parametrize(
    ("soname", "package"),
    [("libxcb-icccm.so.4", "libxcb-icccm4"), ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
     ("libxcb-render-util.so.0.0.0", "libxcb-render-util0")],
)
def test_debian_package_names(soname: str, package: str) -> None:
    assert entry.debian_package(soname) == package


def test_without_a_display_the_app_says_so_instead_of_blaming_a_library(
    x11_lacking_icccm: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Qt aborted (SIGABRT) naming libxcb-cursor0, installed or not.
    import seqmoe_chat.application

    monkeypatch.delenv("DISPLAY")
    monkeypatch.setattr(seqmoe_chat.application, "run_app", lambda *args: pytest.fail("Qt would abort"))
    assert entry.main([]) == 1
    assert capsys.readouterr().err == (
        "seqmoe-chat: there is no display to open the window on (DISPLAY is not set); the commands export, "
        "import and list need none, and --self-test checks the app headless\n")
