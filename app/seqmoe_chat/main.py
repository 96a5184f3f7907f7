"""The ``seqmoe-chat`` entry point: the window, the self-test, or a headless command."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import cli


def main(argv: Sequence[str] | None = None) -> int:
    _attach_console()
    # Before the engine loads PyTorch: OpenMP threads that spin while idle take the cores from
    # the window's thread (and, then, the engine's copy thread); sleeping ones made the first token
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
    """Why the window cannot open, when that can be told before Qt tries: on X11, a display, and Qt's
    platform plugin needs system libraries (libxcb-cursor, -icccm, -keysyms, ...) that many Linux
    systems lack, and without one Qt aborts with a message that does not say which."""
    if not sys.platform.startswith("linux"):
        return None
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not (platform.startswith("xcb") or (not platform and not os.environ.get("WAYLAND_DISPLAY"))):
        return None
    if not os.environ.get("DISPLAY"):
        # Over SSH or on a text console Qt aborted, blaming a library that was installed.
        return ("there is no display to open the window on (DISPLAY is not set); the commands "
                "export, import and list need none, and --self-test checks the app headless")
    import PySide6

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    if not plugin.is_file():
        return None
    try:
        ctypes.CDLL(str(plugin))  # what Qt will load; the loader names the first library it lacks
    except OSError as error:
        missing = str(error).split(":", 1)[0]
        if "cannot open shared object file" not in str(error):
            return f"the window cannot open on X11: Qt's platform plugin does not load ({error})"
        return (
            f"the window cannot open on X11: the system library {missing} is not installed "
            f"(Debian, Ubuntu: sudo apt install {debian_package(missing)})"
        )
    return None


def debian_package(soname: str) -> str:
    """Debian's name for the package of a shared library: libfoo.so.1 is in libfoo1, libfoo2.so.0
    in libfoo2-0."""
    name, _, version = soname.partition(".so.")
    major = version.split(".")[0]
    return f"{name}-{major}" if name[-1:].isdigit() else f"{name}{major}"


def _attach_console() -> None:
    """On Windows, the GUI entry point has no console; a command typed in one still
    prints there by attaching to the parent's console."""
    if sys.platform != "win32" or sys.stdout is not None:
        return
    if ctypes.windll.kernel32.AttachConsole(-1):  # -1: the parent process's console
        sys.stdout = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        sys.stderr = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115
