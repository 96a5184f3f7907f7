"""A child process whose output arrives line by line in a queue, read by two threads, so
that the caller (the GUI thread, polling) never blocks on it. Closing the child's stdin
tells it that its parent is gone (see ``exit_with_parent``)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

STDOUT = "stdout"
STDERR = "stderr"


class ChildProcess:
    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._process = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, encoding="utf-8", errors="replace", bufsize=1, env=env,
        )
        self._readers = [
            threading.Thread(target=self._read, args=(stream, name), daemon=True, name=f"child-{name}")
            for stream, name in ((self._process.stdout, STDOUT), (self._process.stderr, STDERR))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], name: str) -> None:
        for line in stream:  # text mode splits tqdm's carriage returns into lines too
            self.lines.put((name, line.rstrip("\r\n")))

    def drain(self) -> list[tuple[str, str]]:
        taken = []
        while True:
            try:
                taken.append(self.lines.get_nowait())
            except queue.Empty:
                return taken

    def exit_code(self) -> int | None:
        """The exit status once the child has ended and all its output is in ``lines`` (drain
        after asking, or the last lines may be left behind)."""
        code = self._process.poll()
        if code is None or any(reader.is_alive() for reader in self._readers):
            return None
        return code

    def terminate(self) -> None:
        """Stop the child at once and reap it. Its stdin closes first: a child that watches it
        (``exit_with_parent``) ends on the spot, where SIGTERM (TerminateProcess on Windows) may
        first unwind a command that cleans up after itself (``seqmoe.stop_signals``)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        if self._process.poll() is None:
            self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def exit_with_parent() -> None:
    """In a child: end this process when the parent's end of stdin closes (the parent quit or
    crashed), so that no orphan keeps writing into files a new run will resume."""

    def watch() -> None:
        sys.stdin.read()
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()
