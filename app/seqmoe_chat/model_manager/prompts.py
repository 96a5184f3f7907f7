"""The Models window's questions to the person and its hand-offs to the desktop, in one
place so that tests can stand in for them."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget


def confirm(parent: QWidget, title: str, text: str) -> bool:
    answer = QMessageBox.question(parent, title, text, QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                                  QMessageBox.StandardButton.Cancel)
    return answer == QMessageBox.StandardButton.Yes


def choose_folder(parent: QWidget) -> Path | None:
    folder = QFileDialog.getExistingDirectory(parent, "Import a model folder (with config.json)")
    return Path(folder) if folder else None


def reveal(folder: Path) -> bool:
    """Open the folder in the file manager; False when the desktop could not."""
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))
