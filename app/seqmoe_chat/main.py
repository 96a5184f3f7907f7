"""The ``seqmoe-chat`` entry point: the window, the self-test, or a headless command."""

from __future__ import annotations

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
    from .application import run_app

    return run_app(args.data_dir, args.model)


def _attach_console() -> None:
    """On Windows, the GUI entry point has no console; a command typed in one still
    prints there by attaching to the parent's console."""
    if sys.platform != "win32" or sys.stdout is not None:
        return
    import ctypes

    if ctypes.windll.kernel32.AttachConsole(-1):  # -1: the parent process's console
        sys.stdout = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        sys.stderr = open("CONOUT$", "w", encoding="utf-8")  # noqa: SIM115
