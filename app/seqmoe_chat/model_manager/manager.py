"""The model manager of the running app: it owns the download queue, the calibration process
and the library listing, polls the child processes from a timer while they run, and tells
the widgets (and the main window's model selector) what changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from ..models.calibration_job import CalibrationRunner, CalibrationStatus
from ..models.download_runner import DownloadRunner
from ..models.library import HUB_CACHE, Library, LibraryError, LibraryItem, LibraryModel
from ..background import run_in_background

POLL_MS = 200


class ModelManager(QObject):
    sig_downloads_changed = Signal()
    sig_download_finished = Signal(object)  # DownloadEntry, done and verified
    sig_calibration_changed = Signal(object)  # CalibrationStatus
    sig_library_changed = Signal(object)  # list[LibraryItem]
    sig_library_failed = Signal(str)
    sig_model_deleted = Signal(str)  # the folder, whose files are gone

    def __init__(
        self,
        data_dir: Path,
        loaded_path: Callable[[], str | None] = lambda: None,
        downloads: DownloadRunner | None = None,
        calibration: CalibrationRunner | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.loaded_path = loaded_path
        self.downloads = downloads or DownloadRunner(data_dir)
        self.calibration = calibration or CalibrationRunner()
        self.library = Library(data_dir)
        self.items: list[LibraryItem] = []
        self.library_problem = ""
        """Why the last listing failed ("" after one that worked), for a Library tab opened later."""
        self._listings = 0
        """Listings asked for so far: only the latest one's answer is shown (an older one may list a
        model deleted since)."""
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._poll)

    def start(self) -> None:
        """After the window shows: list the library, continue the queued downloads."""
        self.refresh_library()
        self._follow()

    # Downloads

    def enqueue(self, repo_id: str, revision: str = "main", total_bytes: int = 0) -> None:
        """Raises ``HubRefusal`` when it cannot be queued (already here, too little disk)."""
        self.downloads.enqueue(repo_id, revision, total_bytes)
        self._follow()

    def cancel_download(self, repo_id: str) -> None:
        self.downloads.cancel(repo_id)
        self.sig_downloads_changed.emit()

    def resume_download(self, repo_id: str) -> None:
        self.downloads.resume(repo_id)
        self._follow()

    def discard_download(self, repo_id: str) -> None:
        self.downloads.discard(repo_id)
        self.sig_downloads_changed.emit()

    # Calibration

    def calibrate(self, model: Path) -> CalibrationStatus:
        status = self.calibration.start(model)
        self.sig_calibration_changed.emit(status)
        self._follow()
        return status

    def cancel_calibration(self) -> None:
        self.calibration.cancel()
        if self.calibration.status is not None:
            self.sig_calibration_changed.emit(self.calibration.status)

    # Library

    def refresh_library(self) -> None:
        self._listings += 1
        number = self._listings
        run_in_background(self.library.items, lambda items: self._on_listed(number, items),
                          lambda error: self._on_list_failed(number, error), self)

    def delete(self, item: LibraryItem) -> None:
        """Raises ``LibraryError`` (the model loaded or loading, the one being calibrated, the bundled
        one, a file system error)."""
        folder = item.model.path.resolve()
        loaded = self.loaded_path()
        if loaded and _names(loaded, item.model, folder):
            raise LibraryError(f"{item.model.name} is loaded or loading; unload it first")
        calibrating = self.calibration.status
        if self.calibration.busy and calibrating is not None and Path(calibrating.model).resolve() == folder:
            raise LibraryError(f"{item.model.name} is being calibrated; cancel that first")
        self.library.delete(item.model)
        if not item.model.path.exists():  # an imported folder only leaves the list: its files stay
            self.downloads.forget_finished(item.model.path)
            self.sig_downloads_changed.emit()
            self.sig_model_deleted.emit(str(item.model.path))
        self.refresh_library()

    def import_folder(self, folder: Path, on_added: Callable[[LibraryModel], None],
                      on_failed: Callable[[Exception], None]) -> None:
        """Check and add ``folder`` off the GUI thread (the check imports the engine)."""

        def added(model: LibraryModel) -> None:
            on_added(model)
            self.refresh_library()

        run_in_background(lambda: self.library.import_folder(folder), added, on_failed, self)

    def shut_down(self) -> None:
        """The app quits: the running download stays queued for next time, a calibration stops."""
        self._timer.stop()
        self.downloads.shut_down()
        self.calibration.shut_down()

    def _on_listed(self, number: int, items: list[LibraryItem]) -> None:
        if number != self._listings:
            return
        self.items, self.library_problem = items, self.library.notice
        self.sig_library_changed.emit(items)
        if self.library.notice:  # listed, but the imported folders' list was reset or the hub cache unreadable
            self.sig_library_failed.emit(self.library.notice)

    def _on_list_failed(self, number: int, error: Exception) -> None:
        if number != self._listings:
            return
        self.library_problem = f"The library could not be listed: {error}"
        self.sig_library_failed.emit(self.library_problem)

    def _follow(self) -> None:
        self.sig_downloads_changed.emit()
        if self.downloads.busy or self.calibration.busy:
            self._timer.start()

    def _poll(self) -> None:
        self.downloads.poll()
        self.sig_downloads_changed.emit()
        while self.downloads.finished:
            self.sig_download_finished.emit(self.downloads.finished.pop(0))
            self.refresh_library()
        status = self.calibration.status
        if self.calibration.poll() and status is not None:
            self.sig_calibration_changed.emit(status)
            if not self.calibration.busy:
                self.refresh_library()
        if not (self.downloads.busy or self.calibration.busy):
            self._timer.stop()


def _names(model: str, library_model: LibraryModel, folder: Path) -> bool:
    """Whether ``model``, a folder or a hub id as the main window loads it, is ``library_model``
    (in ``folder``, its path resolved)."""
    path = Path(model).expanduser()
    if path.exists():
        return path.resolve() == folder
    # A hub id is loaded from the Hugging Face cache (downloading what it lacks), whichever revision it takes.
    return library_model.source == HUB_CACHE and model == library_model.repo_id
