"""The Downloads tab: one row per download with its progress (bytes, speed, time left),
Cancel, Resume, Remove, and the reason when it stopped."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QScrollArea, QVBoxLayout, QWidget

from ..models.download_queue import CANCELLED, DONE, FAILED, QUEUED, RUNNING, WAITING, DownloadEntry
from ..models.hub_errors import GATED
from ..models.units import duration_text, size_text
from .manager import ModelManager


def detail_text(entry: DownloadEntry, speed: float, seconds_left: float | None) -> str:
    if entry.state == RUNNING and entry.message == "Downloading" and entry.total_bytes:
        parts = [f"{size_text(entry.done_bytes)} of {size_text(entry.total_bytes)}"]
        if speed > 0:
            parts.append(f"{size_text(speed)}/s")
        if seconds_left is not None:
            parts.append(f"{duration_text(seconds_left)} left")
        return " · ".join(parts)
    if entry.state == QUEUED:
        return "Queued" + (f": {size_text(entry.done_bytes)} of {size_text(entry.total_bytes)} already here"
                           if entry.done_bytes and entry.total_bytes else "")
    if entry.state == DONE:
        return f"{entry.message}: {entry.path}"
    return entry.message


class DownloadRow(QWidget):
    sig_token_requested = Signal()

    def __init__(self, manager: ModelManager, repo_id: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.repo_id = repo_id
        self.name = QLabel(repo_id)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(lambda: manager.cancel_download(repo_id))
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(lambda: manager.resume_download(repo_id))
        self.token_button = QPushButton("Enter token…")
        self.token_button.setToolTip("Go to the Catalog tab's hub field to enter an access token")
        self.token_button.clicked.connect(self.sig_token_requested)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Forget this download and delete its partial files")
        self.remove_button.clicked.connect(lambda: manager.discard_download(repo_id))
        buttons = QHBoxLayout()
        buttons.addWidget(self.name, 1)
        for button in (self.cancel_button, self.resume_button, self.token_button, self.remove_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.detail)

    def show_entry(self, entry: DownloadEntry, speed: float, seconds_left: float | None) -> None:
        self.progress.setValue(round(1000 * entry.done_bytes / entry.total_bytes) if entry.total_bytes else 0)
        self.detail.setText(detail_text(entry, speed, seconds_left))
        self.cancel_button.setVisible(entry.state in (QUEUED, RUNNING, WAITING))
        self.resume_button.setVisible(entry.state in (CANCELLED, FAILED))
        self.token_button.setVisible(entry.state == FAILED and entry.error_kind == GATED)
        self.remove_button.setVisible(entry.state != RUNNING)
        self.remove_button.setText("Clear" if entry.state == DONE else "Remove")


class DownloadsTab(QWidget):
    sig_token_requested = Signal(str)  # repo id

    def __init__(self, manager: ModelManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.manager = manager
        self.rows: dict[str, DownloadRow] = {}
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        self.empty = QLabel("No downloads. Choose a model in the Catalog tab.")
        self.list = QVBoxLayout()
        holder = QWidget()
        holder_layout = QVBoxLayout(holder)
        holder_layout.addLayout(self.list)
        holder_layout.addStretch()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(holder)
        layout = QVBoxLayout(self)
        layout.addWidget(self.notice)
        layout.addWidget(self.empty)
        layout.addWidget(scroll, 1)
        manager.sig_downloads_changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        runner = self.manager.downloads
        self.notice.setText(runner.notice)
        self.notice.setVisible(bool(runner.notice))
        present = {entry.repo_id for entry in runner.entries}
        for repo_id in set(self.rows) - present:
            self.rows.pop(repo_id).deleteLater()
        for entry in runner.entries:
            row = self.rows.get(entry.repo_id)
            if row is None:
                row = self.rows[entry.repo_id] = DownloadRow(self.manager, entry.repo_id)
                row.sig_token_requested.connect(lambda repo_id=entry.repo_id: self.sig_token_requested.emit(repo_id))
                self.list.addWidget(row)
            row.show_entry(entry, runner.speed(entry.repo_id), runner.seconds_left(entry))
        self.empty.setVisible(not runner.entries)
