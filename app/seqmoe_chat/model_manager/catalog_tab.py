"""The Catalog tab: the curated MoE models with what each needs and whether it fits this
computer, and below them any other hub id."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHeaderView, QLabel, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from ..models.catalog import CatalogEntry, load_catalog
from ..models.fit import DeviceMemory, Fit, fit, probe_device
from ..models.units import parameters_text, size_text
from ..background import run_in_background
from .hub_panel import HubPanel
from .tables import read_only_table

COLUMNS = ("Model", "On this computer", "Parameters", "Experts", "Per expert", "Download", "Licence", "")
FIT_COLUMN, LICENCE_COLUMN = 1, 6
FIT_WIDTH = 250
"""Pixels for what fits: the longest labels wrap onto a second line instead of squeezing the others."""
CONNECTION_NOTE = "Downloads need a connection to the Hugging Face hub; models already here work offline."
OFFLINE_NOTE = "Offline (HF_HUB_OFFLINE is set): downloads need a connection. Your library works as usual."


@dataclass(frozen=True)
class CatalogView:
    device: DeviceMemory
    rows: list[tuple[CatalogEntry, Fit]]


def catalog_view(budget_bytes: int | None, context_tokens: int) -> CatalogView:
    """The catalog with each entry's fit (imports PyTorch: off the GUI thread)."""
    device = probe_device(budget_bytes, context_tokens)
    return CatalogView(device, [(entry, fit(entry.shape, device)) for entry in load_catalog()])


def is_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE


class CatalogTab(QWidget):
    sig_download_requested = Signal(str, str, int)  # repo id, revision, expected bytes

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view: CatalogView | None = None
        self.device_line = QLabel("Measuring this computer…")
        self.device_line.setWordWrap(True)
        self.connection = QLabel(OFFLINE_NOTE if is_offline() else CONNECTION_NOTE)
        self.connection.setObjectName("connectionNote")
        self.connection.setWordWrap(True)
        self.table = read_only_table(COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(FIT_COLUMN, QHeaderView.ResizeMode.Fixed)
        header.resizeSection(FIT_COLUMN, FIT_WIDTH)
        header.setSectionResizeMode(LICENCE_COLUMN, QHeaderView.ResizeMode.Stretch)
        self.table.setWordWrap(True)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.hub = HubPanel()
        self.hub.sig_download_requested.connect(
            lambda model: self.sig_download_requested.emit(model.reference.repo_id, model.reference.revision, model.download_bytes)
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.device_line)
        layout.addWidget(self.connection)
        layout.addWidget(self.table, 1)
        layout.addWidget(QLabel("Another model from the hub:"))
        layout.addWidget(self.hub)

    def load(self, budget_bytes: int | None, context_tokens: int) -> None:
        run_in_background(lambda: catalog_view(budget_bytes, context_tokens), self.show_view, self._on_failed, self)

    def show_view(self, view: CatalogView) -> None:
        self.view = view
        self.hub.device = view.device
        self.device_line.setText(view.device.describe())
        self.table.setRowCount(len(view.rows))
        offline = is_offline()
        self.connection.setText(OFFLINE_NOTE if offline else CONNECTION_NOTE)
        for row, (entry, fits) in enumerate(view.rows):
            shape = entry.shape
            stored = (f"{size_text(entry.stored_bytes_per_expert)} as {entry.stored_dtype.upper()} on disk, "
                      f"{size_text(shape.bytes_per_expert)} in memory and over the link\n\n"
                      if entry.stored_bytes_per_expert != shape.bytes_per_expert else "")
            cells = (
                entry.name,
                fits.label if entry.runs else f"cannot run: {entry.refusal}",
                f"{parameters_text(shape.parameters_total)} / {parameters_text(shape.parameters_active)} active",
                f"{shape.moe_layers} layers × {shape.experts_per_layer}, top-{shape.top_k}",
                size_text(shape.bytes_per_expert),
                size_text(entry.download_bytes),
                entry.license + (f", gated ({entry.gated})" if entry.gated else ""),
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{text}\n\n{stored}{entry.repo_id}: {entry.summary}\n\n{entry.notes}")
                self.table.setItem(row, column, item)
            button = QPushButton("Download")
            button.setEnabled(entry.runs and not offline)
            button.setToolTip(OFFLINE_NOTE if offline else (entry.refusal or f"Download {entry.repo_id}"))
            button.clicked.connect(lambda _=False, e=entry: self.sig_download_requested.emit(e.repo_id, "main", e.download_bytes))
            self.table.setCellWidget(row, len(COLUMNS) - 1, button)

    def fit_labels(self) -> dict[str, str]:
        """Model name to what the table says about fitting (for tests and accessibility checks)."""
        return {self.table.item(r, 0).text(): self.table.item(r, FIT_COLUMN).text() for r in range(self.table.rowCount())}

    def _on_failed(self, error: Exception) -> None:
        self.device_line.setText(f"The catalog could not be shown: {error}")

