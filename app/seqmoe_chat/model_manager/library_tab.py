"""The Library tab: the models on this computer with their size and predictor state; load,
calibrate (with progress and Cancel), reveal in the file manager, delete, import a folder."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from ..models.calibration_job import RUNNING, CalibrationStatus
from ..models.library import BUNDLED, IMPORTED, LibraryError, LibraryItem
from ..models.units import size_text
from . import prompts
from .manager import ModelManager
from .tables import read_only_table

COLUMNS = ("Model", "Source", "Size", "Predictor", "Folder")


class LibraryTab(QWidget):
    sig_load_requested = Signal(str)  # a model folder; empty: the bundled demo model

    def __init__(self, manager: ModelManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.manager = manager
        self.items: list[LibraryItem] = []
        self.table = read_only_table(COLUMNS)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(lambda _item: self.load())
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.calibration = QProgressBar()
        self.calibration.setRange(0, 100)
        self.calibration_text = QLabel()
        self.calibration_text.setWordWrap(True)
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for name, slot, tip in (
            ("Load", self.load, "Chat with this model"),
            ("Calibrate", self.calibrate, "Train the SeqMoE predictor for this model (a few minutes)"),
            ("Cancel calibration", manager.cancel_calibration, "Stop the calibration; nothing is saved"),
            ("Reveal", self.reveal, "Show the model's folder in the file manager"),
            ("Delete…", self.delete, "Delete the model from the disk (an imported folder is only taken off the list)"),
            ("Import folder…", self.import_folder, "Add a model folder from elsewhere on the disk"),
            ("Refresh", manager.refresh_library, "List the models again"),
        ):
            button = self.buttons[name] = QPushButton(name)
            button.setToolTip(tip)
            button.clicked.connect(slot)
            row.addWidget(button)
        row.addStretch()
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(row)
        layout.addWidget(self.calibration)
        layout.addWidget(self.calibration_text)
        layout.addWidget(self.message)
        manager.sig_library_changed.connect(self.show_items)
        manager.sig_library_failed.connect(self._show_problem)
        manager.sig_calibration_changed.connect(self.show_calibration)
        self._problem = ""
        self.show_items(manager.items)
        self._show_problem(manager.library_problem)
        self.calibration.setVisible(False)

    def show_items(self, items: list[LibraryItem]) -> None:
        if self._problem and self.message.text() == self._problem:
            self._show_problem("")  # listed after all
        chosen = self.selected()
        self.items = items
        # Kept by path, not by row: the row of an entry gone would select the next one.
        self.table.clearSelection()
        self.table.setRowCount(len(items))
        for row, item in enumerate(items):
            model = item.model
            size = "folder missing" if model.missing else size_text(model.size_bytes)
            cells = (model.name, model.source, size, item.predictor.summary, str(model.path))
            for column, text in enumerate(cells):
                self.table.setItem(row, column, QTableWidgetItem(text))
            if chosen is not None and model.path == chosen.model.path:
                self.table.selectRow(row)
        self._update_buttons()

    def _show_problem(self, problem: str) -> None:
        self._problem = problem
        self.message.setText(problem)

    def selected(self) -> LibraryItem | None:
        rows = self.table.selectionModel().selectedRows()
        return self.items[rows[0].row()] if rows and rows[0].row() < len(self.items) else None

    def select(self, path_text: str) -> None:
        for row, item in enumerate(self.items):
            if str(item.model.path) == path_text:
                self.table.selectRow(row)

    def load(self) -> None:
        item = self.selected()
        if item is not None and not item.model.missing:
            self.sig_load_requested.emit("" if item.model.source == BUNDLED else str(item.model.path))

    def calibrate(self) -> None:
        item = self.selected()
        if item is None:
            return
        try:
            self.manager.calibrate(item.model.path)
        except RuntimeError as error:
            self.message.setText(str(error))

    def reveal(self) -> None:
        item = self.selected()
        if item is not None and not prompts.reveal(item.model.path):
            self.message.setText(f"The file manager could not be opened on {item.model.path}")

    def delete(self) -> None:
        item = self.selected()
        if item is None:
            return
        model = item.model
        if model.source == IMPORTED:
            question = f"Take {model.name} off the list? Its folder {model.path} stays on the disk."
        else:
            question = f"Delete {model.name} ({size_text(model.size_bytes)}) from the disk?\n{model.path}"
        if not prompts.confirm(self, "Delete the model", question):
            return
        try:
            self.manager.delete(item)
        except LibraryError as error:
            self.message.setText(str(error))
            return
        self.message.setText(f"{model.name} was {'taken off the list' if model.source == IMPORTED else 'deleted'}.")

    def import_folder(self) -> None:
        folder = prompts.choose_folder(self)
        if folder is None:
            return
        self.message.setText(f"Checking {folder}…")
        self.manager.import_folder(folder, lambda model: self.message.setText(f"{model.name} was added to the library."),
                                   lambda error: self.message.setText(f"{folder} was not imported: {error}"))

    def show_calibration(self, status: CalibrationStatus) -> None:
        running = status.state == RUNNING
        self.calibration.setVisible(running)
        self.calibration.setValue(round(100 * status.fraction))
        name = status.model.name
        self.calibration_text.setText(f"Calibrating {name}: {status.stage}" if running else status.message)
        self._update_buttons()

    def _update_buttons(self) -> None:
        item = self.selected()
        calibrating = self.manager.calibration.busy
        present = item is not None and not item.model.missing
        self.buttons["Load"].setEnabled(present)
        self.buttons["Calibrate"].setEnabled(present and not calibrating)
        self.buttons["Cancel calibration"].setVisible(calibrating)
        self.buttons["Reveal"].setEnabled(present)
        self.buttons["Delete…"].setEnabled(item is not None and item.model.source != BUNDLED)
