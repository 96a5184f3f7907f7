"""The Models window: Catalog, Library and Downloads tabs, and after a download the offer to
calibrate the new model's predictor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPushButton, QTabWidget, QVBoxLayout, QWidget

from ..models.download_queue import DownloadEntry
from ..models.hub_errors import HubRefusal
from ..store import EngineOptions
from .catalog_tab import CatalogTab
from .downloads_tab import DownloadsTab
from .library_tab import LibraryTab
from .manager import ModelManager


class ModelsDialog(QDialog):
    sig_load_requested = Signal(str)

    def __init__(self, manager: ModelManager, engine_options: Callable[[], EngineOptions] = EngineOptions,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(1100, 640)
        self.manager = manager
        self.engine_options = engine_options
        self.catalog = CatalogTab()
        self.library = LibraryTab(manager)
        self.downloads = DownloadsTab(manager)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.catalog, "Catalog")
        self.tabs.addTab(self.library, "Library")
        self.tabs.addTab(self.downloads, "Downloads")
        self.offer = QLabel()
        self.offer.setWordWrap(True)
        self.offer_calibrate = QPushButton("Calibrate now")
        self.offer_later = QPushButton("Later")
        self.offer_bar = QWidget()
        offer_layout = QHBoxLayout(self.offer_bar)
        offer_layout.setContentsMargins(0, 0, 0, 0)
        offer_layout.addWidget(self.offer, 1)
        offer_layout.addWidget(self.offer_calibrate)
        offer_layout.addWidget(self.offer_later)
        self.offer_bar.setVisible(False)
        self.status = QLabel()
        self.status.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.offer_bar)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.status)
        self._offered: DownloadEntry | None = None
        self.catalog.sig_download_requested.connect(self.download)
        self.library.sig_load_requested.connect(self.sig_load_requested)
        self.downloads.sig_token_requested.connect(self._ask_token)
        self.offer_calibrate.clicked.connect(self._calibrate_offered)
        self.offer_later.clicked.connect(lambda: self.offer_bar.setVisible(False))
        manager.sig_download_finished.connect(self._offer_calibration)

    def open_tab(self, index: int = 0) -> None:
        """Show the window (the catalog's fits follow the current VRAM budget and context)."""
        options = self.engine_options()
        budget = int(options.vram_budget_gb * 2**30) if options.vram_budget_gb else None
        self.catalog.load(budget, options.context_tokens)
        self.tabs.setCurrentIndex(index)
        self.show()
        self.raise_()
        self.activateWindow()

    def download(self, repo_id: str, revision: str, total_bytes: int) -> None:
        try:
            self.manager.enqueue(repo_id, revision, total_bytes)
        except HubRefusal as refusal:
            self.status.setText(f"{repo_id} was not queued: {refusal}")
            return
        self.status.setText(f"{repo_id} is queued; its progress is in the Downloads tab.")
        self.tabs.setCurrentWidget(self.downloads)

    def _ask_token(self, repo_id: str) -> None:
        self.tabs.setCurrentWidget(self.catalog)
        self.catalog.hub.reference.setText(repo_id)
        self.catalog.hub.check()

    def _offer_calibration(self, entry: DownloadEntry) -> None:
        self._offered = entry
        self.status.clear()
        self.offer.setText(f"{entry.repo_id} is downloaded and verified. Calibrate its SeqMoE predictor now? "
                           "It traces a short text and trains for a few minutes; until then the engine forecasts "
                           "with the next layer's router.")
        self.offer_bar.setVisible(True)

    def _calibrate_offered(self) -> None:
        self.offer_bar.setVisible(False)
        if self._offered is None:
            return
        try:
            self.manager.calibrate(Path(self._offered.path))
        except RuntimeError as error:
            self.status.setText(str(error))
            return
        self.tabs.setCurrentWidget(self.library)
        self.library.select(self._offered.path)
