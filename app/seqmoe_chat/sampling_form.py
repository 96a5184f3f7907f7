"""Fields for sampling settings, shared by the settings dialog and a conversation's dialog."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from .store import SamplingSettings
from .store.records import MAX_NEW_TOKENS, SEEDS, TEMPERATURES, TOP_PS

RANDOM_SEED = -1


class SamplingForm(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(*TEMPERATURES)
        self.temperature.setSingleStep(0.05)
        self.temperature.setToolTip("0 always picks the most likely token (greedy)")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(*TOP_PS)
        self.top_p.setSingleStep(0.05)
        self.top_p.setToolTip("Sample only from the most likely tokens that together have this probability")
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(*MAX_NEW_TOKENS)
        self.seed = QSpinBox()
        self.seed.setRange(RANDOM_SEED, SEEDS[1])
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("The same seed and settings give the same reply")
        layout = QFormLayout(self)
        layout.addRow("Temperature", self.temperature)
        layout.addRow("Top-p", self.top_p)
        layout.addRow("Max new tokens", self.max_new_tokens)
        layout.addRow("Seed", self.seed)

    def value(self) -> SamplingSettings:
        seed = self.seed.value()
        return SamplingSettings(
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            max_new_tokens=self.max_new_tokens.value(),
            seed=None if seed == RANDOM_SEED else seed,
        )

    def set_value(self, sampling: SamplingSettings) -> None:
        self.temperature.setValue(sampling.temperature)
        self.top_p.setValue(sampling.top_p)
        self.max_new_tokens.setValue(sampling.max_new_tokens)
        self.seed.setValue(RANDOM_SEED if sampling.seed is None else sampling.seed)
