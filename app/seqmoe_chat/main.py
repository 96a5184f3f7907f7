"""The ``seqmoe-chat`` entry point: the window, the self-test, or a headless command."""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Sequence

from . import cli


def main(argv: Sequence[str] | None = None) -> int:
    _attach_console()
    # Before the engine loads PyTorch: OpenMP threads that spin while idle take the cores from
    # the window's thread and the engine's copy thread; sleeping ones made the first token
    # 10-20x sooner and decoding 3-4x faster on a busy 2-core machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = cli.parse(argv)
    if args.command:
        return cli.run_command(args)
    if args.desktop_entry:
        from .desktop_entry import run_desktop_entry

        return run_desktop_entry(args.desktop_entry)
    if args.self_test:
        from .self_test import run_self_test

        return run_self_test(args.model)
    problem = display_problem()
    if problem:
        print(f"seqmoe-chat: {problem}", file=sys.stderr)
        return 1
    from .application import run_app

    return run_app(args.data_dir, args.model)


def display_problem() -> str | None:
    """Why the window cannot open, when that can be told before Qt tries: on X11, Qt 6.5 and
    newer need libxcb-cursor, which many Linux desktops lack, and without it Qt aborts with a
    message that does not say what to install."""
    if not sys.platform.startswith("linux"):
        return None
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    on_x11 = platform.startswith("xcb") or (not platform and not os.environ.get("WAYLAND_DISPLAY"))
    if not on_x11 or ctypes.util.find_library("xcb-cursor"):
        return None
    return (
        "the window needs the X11 cursor library, which is not installed: install libxcb-cursor0 "
        "(Debian, Ubuntu: sudo apt install libxcb-cursor0; Fedora: sudo dnf install xcb-util-cursor)"
    )


def _attach_console() -> None:
    """On Windows, the GUI entry point has no console; a command typed in one still
    prints there by attaching to the parent's console."""
    if sys.platform != "win32" or sys.stdout is not None:
        return
    if ctypes.windll.kernel32.AttachConsole(-1):  # -1: the parent process's console
        sys.stdout = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        sys.stderr = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115
