"""The line above the chat: the conversation's title, its system prompt, its settings."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from .elided_label import ElidedLabel
from .store import Conversation

PROMPT_PREVIEW_CHARS = 120


class ChatHeader(QWidget):
    sig_settings_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # Elided: a long title or prompt must not make the chat's column wider than the window allows.
        self.title = ElidedLabel()
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.2)
        font.setBold(True)
        self.title.setFont(font)
        self.system_prompt = ElidedLabel()
        self.system_prompt.setStyleSheet("color: #8a8a8a;")
        self.settings_button = QPushButton("Prompt && sampling…")
        self.settings_button.setToolTip("The system prompt and sampling settings of this conversation")
        self.settings_button.clicked.connect(self.sig_settings_requested)
        text = QVBoxLayout()
        text.setSpacing(0)
        text.addWidget(self.title)
        text.addWidget(self.system_prompt)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        layout.addLayout(text, 1)
        layout.addWidget(self.settings_button, 0, Qt.AlignmentFlag.AlignTop)

    def show_conversation(self, conversation: Conversation | None) -> None:
        self.title.set_full_text(conversation.title if conversation else "New chat")
        prompt = " ".join(conversation.system_prompt.split()) if conversation else ""
        if len(prompt) > PROMPT_PREVIEW_CHARS:
            prompt = prompt[: PROMPT_PREVIEW_CHARS - 1] + "…"
        self.system_prompt.set_full_text(f"System prompt: {prompt}" if prompt else "No system prompt")
