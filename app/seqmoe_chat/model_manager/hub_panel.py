"""Any hub id or hub address: checked from its config.json before a download is offered;
a gated model asks for an access token, which goes to huggingface_hub's token store."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QLineEdit, QPushButton, QWidget

from ..models.fit import DeviceMemory, fit
from ..models.hub_check import HubModel, check_repo, parse_reference, save_token
from ..models.hub_errors import GATED, HubRefusal
from ..models.units import parameters_text, size_text
from ..background import run_in_background


class HubPanel(QWidget):
    sig_download_requested = Signal(object)  # HubModel

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.device: DeviceMemory | None = None
        self.model: HubModel | None = None
        self._checks = 0
        """Checks asked for so far: only the latest one's answer is shown (and offered for download)."""
        self.reference = QLineEdit()
        self.reference.setPlaceholderText("Any hub id or address: owner/name or https://huggingface.co/owner/name")
        self.reference.returnPressed.connect(self.check)
        self.check_button = QPushButton("Check")
        self.check_button.setToolTip("Fetch only its config.json and ask the engine whether it can run it")
        self.check_button.clicked.connect(self.check)
        self.result = QLabel()
        self.result.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(lambda: self.sig_download_requested.emit(self.model))
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("Hugging Face access token (huggingface.co, Settings, Access Tokens)")
        self.token.returnPressed.connect(self.save_token)
        self.token_button = QPushButton("Save token")
        self.token_button.clicked.connect(self.save_token)
        layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.reference, 0, 0)
        layout.addWidget(self.check_button, 0, 1)
        layout.addWidget(self.result, 1, 0)
        layout.addWidget(self.download_button, 1, 1)
        layout.addWidget(self.token, 2, 0)
        layout.addWidget(self.token_button, 2, 1)
        self._show(None, "")

    def check(self) -> None:
        self._checks += 1
        number = self._checks
        try:
            reference = parse_reference(self.reference.text())
        except HubRefusal as refusal:
            self._show(None, str(refusal))
            return
        self._show(None, f"Checking {reference.repo_id}: fetching its config.json…")
        run_in_background(lambda: check_repo(reference), lambda model: self._on_checked(number, model),
                          lambda error: self._on_failed(number, error), self)

    def save_token(self) -> None:
        token = self.token.text()
        self.token_button.setEnabled(False)
        self.result.setText("Checking the token with the hub…")
        run_in_background(lambda: save_token(token), lambda _none: self._on_token_saved(), self._on_token_failed, self)

    def _on_token_saved(self) -> None:
        self.token.clear()
        self.check()

    def _on_token_failed(self, error: Exception) -> None:
        self._show(None, str(error), ask_token=True)

    def _on_checked(self, number: int, model: HubModel) -> None:
        if number != self._checks:
            return
        shape = model.shape
        fits = f" On this computer: {fit(shape, self.device).label}." if self.device is not None else ""
        gated = f", gated ({model.gated})" if model.gated else ""
        self._show(model, (
            f"{model.reference.repo_id}: {model.architecture}, {parameters_text(shape.parameters_total)} parameters "
            f"({parameters_text(shape.parameters_active)} active); {shape.moe_layers} MoE layers × "
            f"{shape.experts_per_layer} experts, top-{shape.top_k}, {size_text(shape.bytes_per_expert)} per expert. "
            f"Download {size_text(model.download_bytes)} in {len(model.files)} files; licence {model.license}{gated}.{fits}"
        ))

    def _on_failed(self, number: int, error: Exception) -> None:
        if number != self._checks:
            return
        if isinstance(error, HubRefusal):
            self._show(None, str(error), ask_token=error.kind == GATED)
        else:
            self._show(None, f"The check failed unexpectedly ({type(error).__name__}: {error}).")

    def _show(self, model: HubModel | None, text: str, ask_token: bool = False) -> None:
        self.model = model
        self.result.setText(text)
        self.check_button.setEnabled(True)
        self.token_button.setEnabled(True)
        self.download_button.setVisible(model is not None)
        if model is not None:
            self.download_button.setText(f"Download {size_text(model.download_bytes)}")
        self.token.setVisible(ask_token)
        self.token_button.setVisible(ask_token)
