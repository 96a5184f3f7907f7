"""The settings dialog: default sampling for new conversations and the theme.

One tab per topic; the engine's VRAM budget gets its own tab when that setting exists.
"""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QTabWidget, QVBoxLayout, QWidget

from .sampling_form import SamplingForm
from .store import Settings
from .store.settings import THEMES


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.sampling = SamplingForm()
        self.sampling.set_value(settings.sampling)
        chat = QWidget()
        chat_layout = QVBoxLayout(chat)
        chat_layout.addWidget(QLabel("Sampling for new conversations:"))
        chat_layout.addWidget(self.sampling)
        chat_layout.addStretch()
        self.theme = QComboBox()
        for theme in THEMES:
            self.theme.addItem(theme.capitalize(), theme)
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        appearance = QWidget()
        QFormLayout(appearance).addRow("Theme", self.theme)
        self.tabs = QTabWidget()
        self.tabs.addTab(chat, "Chat")
        self.tabs.addTab(appearance, "Appearance")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(buttons)

    def apply_to(self, settings: Settings) -> None:
        settings.sampling = self.sampling.value()
        settings.theme = str(self.theme.currentData())
