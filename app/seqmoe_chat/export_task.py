"""Writing an export off the GUI thread: drawing the conversations' code (Pygments) took the
window 3 s for a chat of 2000 messages as HTML, and 9 s for 5000 chats. The transcripts are read
on the GUI thread first (its database connection stays there); the thread only renders and writes."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from .transcripts.export import write_export
from .transcripts.transcript import Transcript

log = logging.getLogger(__name__)


class ExportTask(QObject):
    """One export at a time; its end arrives as a signal on the thread that made this object."""

    sig_finished = Signal(str, int)  # path, conversations written
    sig_failed = Signal(str)  # the reason, for people

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._running = False
        # Connected first, so that the window's own slots already find the export done.
        self.sig_finished.connect(self._done)
        self.sig_failed.connect(self._done)

    @property
    def running(self) -> bool:
        """From ``start`` until its end has arrived on this object's thread; the thread itself lives a
        moment longer, and an export asked for in that moment was turned away."""
        return self._running

    def start(self, path: Path, transcripts: list[Transcript], fmt: str) -> None:
        self._running = True
        # Not a daemon: the app waits for a file half written before it quits.
        threading.Thread(target=self._write, args=(path, transcripts, fmt), name="export").start()

    def _done(self, *_: object) -> None:
        self._running = False

    def _write(self, path: Path, transcripts: list[Transcript], fmt: str) -> None:
        try:
            write_export(path, transcripts, fmt)
        except OSError as error:
            self.sig_failed.emit(f"{path} could not be written: {error.strerror or error}")
        except Exception as error:  # stored data an export cannot show: a bug, but no reason to lose the window
            log.exception("exporting to %s failed", path)
            self.sig_failed.emit(f"The conversation(s) could not be exported: {error}")
        else:
            self.sig_finished.emit(str(path), len(transcripts))
