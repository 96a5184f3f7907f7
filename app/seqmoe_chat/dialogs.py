"""The app's file choosers and messages, in one place so that tests can stand in for them."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths, Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from .transcripts.export import FORMAT_NAMES, export_target

_FILTERS = {fmt: f"{name} (*.{fmt})" for fmt, name in FORMAT_NAMES.items()}


def ask_export_path(parent: QWidget, suggested_name: str, fmt: str | None) -> tuple[Path, str] | None:
    """A file to export to and its format: the typed extension's, else the chosen filter's (or ``fmt``'s, when given)."""
    filters = [_FILTERS[fmt]] if fmt else list(_FILTERS.values())
    # In the user's documents, not wherever the app was started from.
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation) or str(Path.home())
    start = str(Path(folder) / f"{suggested_name}.{fmt or 'md'}")
    path, chosen = QFileDialog.getSaveFileName(parent, "Export", start, ";;".join(filters))
    if not path:
        return None
    return export_target(Path(path), fmt or next((f for f, text in _FILTERS.items() if text == chosen), "md"))


def ask_import_path(parent: QWidget) -> Path | None:
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversations", "", "SeqMoE Chat JSON (*.json)")
    return Path(path) if path else None


def show_error(parent: QWidget, title: str, text: str) -> QMessageBox:
    """A window-modal message that does not block the caller (the GUI keeps running)."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("errorMessage")
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box


def show_fatal(title: str, text: str) -> None:
    """A message shown before the app gives up starting; returns when it is closed."""
    QMessageBox.critical(None, title, text)
