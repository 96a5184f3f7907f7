"""A conversation's own settings: its system prompt and how its replies are sampled."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from .sampling_form import SamplingForm
from .store import SamplingSettings


class ConversationDialog(QDialog):
    def __init__(self, title: str, system_prompt: str, sampling: SamplingSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Prompt and sampling: {title}")
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant. Answer in English.")
        self.sampling = SamplingForm()
        self.sampling.set_value(sampling)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("System prompt (sent before the conversation, to every reply):"))
        layout.addWidget(self.system_prompt)
        layout.addWidget(QLabel("Sampling:"))
        layout.addWidget(self.sampling)
        layout.addWidget(buttons)

    def values(self) -> tuple[str, SamplingSettings]:
        return self.system_prompt.toPlainText().strip(), self.sampling.value()
