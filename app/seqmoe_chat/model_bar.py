"""The toolbar's model controls: which model, load, unload, and loading progress with Cancel.

Choosing and downloading models belongs to the model manager (the "Models…" action beside
this bar); here the choice is the bundled demo model, recently used folders, the models of
the library, or another folder on disk.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget
from seqmoe.hub_files import model_name

from .elided_label import ElidedLabel
from .tooltips import plain_tooltip
from .worker import ModelInfo

DEMO_LABEL = "SeqMoE demo (bundled)"
_OTHER = "\0other"


class ModelBar(QWidget):
    sig_load_requested = Signal(str)  # model folder or hub id; empty: the demo model
    sig_unload_requested = Signal()
    sig_load_cancel_requested = Signal()
    sig_state_shown = Signal(bool, bool)  # loading, a model loaded: for the same actions elsewhere (a menu)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.models = QComboBox()
        self.models.setMinimumContentsLength(22)
        self.models.setToolTip("The model to chat with")
        self.models.activated.connect(self._on_activated)
        self.load_button = QPushButton("Load")
        self.load_button.clicked.connect(lambda: self.sig_load_requested.emit(self.chosen_model()))
        self.unload_button = QPushButton("Unload")
        self.unload_button.setToolTip("Free the memory the model takes")
        self.unload_button.clicked.connect(self.sig_unload_requested)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setFixedWidth(140)
        self.stage = ElidedLabel()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop loading the model")
        self.cancel_button.clicked.connect(self.sig_load_cancel_requested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addWidget(QLabel("Model:"))
        for widget in (self.models, self.load_button, self.unload_button, self.progress, self.stage, self.cancel_button):
            layout.addWidget(widget)
        self._previous_index = 0
        self._recent: list[str] = []
        self._library: list[tuple[str, str]] = []
        self.set_models([], "")
        self.show_unloaded()

    def set_models(self, recent: list[str], current: str) -> None:
        self._recent = list(recent)
        self.models.clear()
        self.models.addItem(DEMO_LABEL, "")
        for model in recent:
            self.models.addItem(self._label(model), model)
            self.models.setItemData(self.models.count() - 1, model, Qt.ItemDataRole.ToolTipRole)
        for label, model in self._library:
            if self.models.findData(model) < 0:
                self.models.addItem(label, model)
                self.models.setItemData(self.models.count() - 1, model, Qt.ItemDataRole.ToolTipRole)
        self.models.addItem("Other folder…", _OTHER)
        self._choose(current)

    def set_library(self, models: list[tuple[str, str]]) -> None:
        """The library's models (label, folder), listed after the recent ones; the choice stays."""
        self._library = list(models)
        self.set_models(self._recent, self.chosen_model())

    def _label(self, model: str) -> str:
        """The library's name for ``model`` where it has one, a hub id as it is, else the folder's."""
        named = {folder: label for label, folder in self._library}
        return named.get(model) or (model_name(Path(model)) if Path(model).is_absolute() else model)

    def chosen_model(self) -> str:
        return str(self.models.currentData())

    def show_loading(self, stage: str, fraction: float) -> None:
        self._set_loading(True)
        self.progress.setValue(round(fraction * 100))
        self.stage.set_full_text(stage)

    def show_loaded(self, info: ModelInfo) -> None:
        self._set_loading(False, loaded=True)
        self.load_button.setText("Reload")
        self.models.setToolTip(plain_tooltip(f"{info.path}\n{info.architecture} on {info.device}"))

    def show_unloaded(self) -> None:
        self._set_loading(False)
        self.load_button.setText("Load")

    def _set_loading(self, loading: bool, loaded: bool = False) -> None:
        for widget in (self.progress, self.stage, self.cancel_button):
            widget.setVisible(loading)
        self.load_button.setEnabled(not loading)
        self.unload_button.setEnabled(loaded)
        self.sig_state_shown.emit(loading, loaded)

    def _on_activated(self, index: int) -> None:
        if self.models.itemData(index) != _OTHER:
            self._previous_index = index
            return
        folder = QFileDialog.getExistingDirectory(self, "Choose a model folder (with config.json)")
        if not folder:
            self.models.setCurrentIndex(self._previous_index)
            return
        self._choose(folder)
        self.sig_load_requested.emit(folder)

    def _choose(self, model: str) -> None:
        """Select ``model``; one not listed yet is listed first after the demo (never twice)."""
        index = self.models.findData(model)
        if index < 0:
            self.models.insertItem(1, self._label(model), model)
            index = 1
        self.models.setCurrentIndex(index)
        self._previous_index = index
