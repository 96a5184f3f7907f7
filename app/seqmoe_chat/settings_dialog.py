"""The settings dialog: the default sampling of new conversations, the engine (device,
policy, link, VRAM budget), the live panel's sampling rate, the theme and the folders.
One tab per topic; the engine tab shows what the loaded model would get."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from .engine_settings import EngineContext, EnginePage
from .sampling_form import SamplingForm
from .store import Settings
from .store.settings import PANEL_HZ, THEMES


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None, engine: EngineContext = EngineContext(),
                 folders: dict[str, Path] | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.sampling = SamplingForm()
        self.sampling.set_value(settings.sampling)
        chat = QWidget()
        chat_layout = QVBoxLayout(chat)
        chat_layout.addWidget(QLabel("Sampling for new conversations:"))
        chat_layout.addWidget(self.sampling)
        chat_layout.addStretch()
        self.engine = EnginePage(settings.engine, engine)
        self.panel_hz = QSpinBox()
        self.panel_hz.setRange(*PANEL_HZ)
        self.panel_hz.setSuffix(" per second")
        self.panel_hz.setValue(settings.panel_hz)
        self.panel_hz.setToolTip("How often the live panel takes the engine's events and redraws")
        panel = QWidget()
        QFormLayout(panel).addRow("Live panel refresh", self.panel_hz)
        self.theme = QComboBox()
        for theme in THEMES:
            self.theme.addItem(theme.capitalize(), theme)
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        appearance = QWidget()
        QFormLayout(appearance).addRow("Theme", self.theme)
        self.tabs = QTabWidget()
        self.tabs.addTab(chat, "Chat")
        self.tabs.addTab(self.engine, "Engine")
        self.tabs.addTab(panel, "Live panel")
        self.tabs.addTab(appearance, "Appearance")
        if folders:
            self.tabs.addTab(_folders_page(folders), "Folders")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.refusal = QLabel()
        self.refusal.setObjectName("settingsRefusal")
        self.refusal.setWordWrap(True)
        self.engine.budget.changed.connect(self._on_engine_changed)
        self.engine.policy.currentIndexChanged.connect(self._on_engine_changed)
        self.engine.device.currentIndexChanged.connect(self._on_engine_changed)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(self.refusal)
        layout.addWidget(buttons)
        self._on_engine_changed()

    def _on_engine_changed(self) -> None:
        # Refused here, not at the next load: a saved budget too small fails every start until changed.
        refusal = self.engine.refusal()
        self.ok_button.setEnabled(refusal is None)
        self.refusal.setText(refusal or "")
        self.refusal.setVisible(refusal is not None)

    def apply_to(self, settings: Settings) -> None:
        settings.sampling = self.sampling.value()
        settings.theme = str(self.theme.currentData())
        settings.panel_hz = self.panel_hz.value()
        self.engine.apply_to(settings.engine)


def _folders_page(folders: dict[str, Path]) -> QWidget:
    """Where the app keeps things, to look at (``--data-dir`` or the environment choose them)."""
    page = QWidget()
    layout = QFormLayout(page)
    for name, folder in folders.items():
        path = QLineEdit(str(folder))
        path.setReadOnly(True)
        open_button = QPushButton("Open")
        open_button.clicked.connect(lambda _checked=False, folder=folder: QDesktopServices.openUrl(
            QUrl.fromLocalFile(str(folder if folder.is_dir() else folder.parent))))
        row = QHBoxLayout()
        row.addWidget(path, 1)
        row.addWidget(open_button)
        layout.addRow(name, row)
    return page
