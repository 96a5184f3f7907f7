"""The settings dialog's engine page: device, cache policy, emulated link (the consumer setup
it imitates, or a fixed speed), the prediction horizon (up to the loaded model's predictor),
the context and the VRAM budget."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QFormLayout, QLabel, QSpinBox, QVBoxLayout, QWidget
from seqmoe.hardware import SETUPS, Setup

from .budget_slider import BudgetSlider
from .engine_import import engine_imported
from .panel.memory_monitor import MemorySample
from .store import EngineOptions
from .store.settings import CONTEXT_TOKENS, DEVICES, LINK_GBPS, POLICIES
from .store.speed_history import measured_speeds
from .worker import ModelInfo

POLICY_NAMES = {
    "seqmoe": "seqmoe: predict the next layers' experts and load them ahead",
    "gate": "gate: load the next layer's likely experts ahead",
    "lru": "lru: load on demand, evict the least recently used",
    "full": "full: every expert in VRAM (the reference speed)",
}
DEVICE_NAMES = {"auto": "automatic (CUDA when present)", "cuda": "CUDA GPU", "cpu": "CPU (emulated link)"}


@dataclass(frozen=True)
class EngineContext:
    """What the engine page shows beside the settings: the loaded model, the device memory a
    budget could use, and the speeds measured so far, by policy."""

    model: ModelInfo | None = None
    available_bytes: int | None = None
    speeds_for: Callable[[str], dict[int, float]] = lambda _policy: {}
    automatic_bytes: int | None = None
    """The budget the worker gives the cache when the user sets none (a CUDA device only)."""
    cuda: bool | None = None
    """Whether PyTorch here can use a CUDA GPU; None until PyTorch has loaded in full (no model yet)."""


def engine_context(model: ModelInfo | None, memory: MemorySample, chats: sqlite3.Connection) -> EngineContext:
    """On a CUDA device a budget can use the free VRAM plus what this process holds, and the
    automatic one leaves a margin of the free VRAM as the worker does; on the CPU the emulated
    budget goes up to the model's full size."""
    # Imported with the engine: asked, never imported here (seconds); not known until that import
    # has ended, as the engine's thread may be halfway through it.
    torch = sys.modules.get("torch") if engine_imported() else None
    cuda = bool(torch.cuda.is_available()) if torch is not None else None
    if model is None:
        return EngineContext(cuda=cuda)
    gpu = memory.gpu if model.device.startswith("cuda") else None

    def speeds_for(policy: str) -> dict[int, float]:
        return measured_speeds(chats, model.name, policy, model.device, model.link_setup, model.link_gbps,
                               model.bytes_per_copy)

    if gpu is None:
        return EngineContext(model, None, speeds_for, cuda=cuda)
    from seqmoe.budget import budget_for_free_memory  # loaded with the model already

    automatic = budget_for_free_memory(gpu.this_process, gpu.total - gpu.used)
    return EngineContext(model, gpu.available_to_this_process, speeds_for, automatic, cuda)


class EnginePage(QWidget):
    def __init__(self, options: EngineOptions, context: EngineContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        model = self.model = context.model
        self.speeds_for = context.speeds_for
        self.cuda = context.cuda
        self.device = _combo(DEVICE_NAMES, DEVICES, options.device)
        self.device.setToolTip("Takes effect when a model is next loaded")
        self.policy = _combo(POLICY_NAMES, POLICIES, options.policy)
        self.link_setup = QComboBox()
        for name, setup in SETUPS.items():
            self.link_setup.addItem(setup_text(setup), name)
        self.link_setup.addItem("a fixed speed", None)
        self.link_setup.setCurrentIndex(max(self.link_setup.findData(options.link_setup), 0)
                                        if options.link_setup is not None else self.link_setup.count() - 1)
        self.link_setup.setToolTip("On machines without a CUDA GPU, experts are copied over an emulated link. Matched to "
                                   "a setup, one copy takes as many layers of this model's decode as there (timed when "
                                   "the model loads), so the cache policies compare as they would on that GPU")
        self.link = QDoubleSpinBox()
        self.link.setRange(*LINK_GBPS)
        self.link.setDecimals(2)
        self.link.setSuffix(" GB/s")
        self.link.setValue(options.link_gbps)
        self.link.setToolTip("How fast the emulated host-to-device link copies experts, when it follows no setup")
        self.link_note = QLabel(link_text(model))
        self.horizon = QSpinBox()
        self.horizon.setRange(1, model.max_horizon if model is not None else 1)
        self.horizon.setSuffix(" MoE layers ahead")
        self.horizon.setValue(options.horizon or self.horizon.maximum())
        # Without a model, or with one whose predictor reaches less, the box cannot show the saved
        # limit; left as shown, it keeps that limit.
        self._horizon_shown, self._horizon_saved = self.horizon.value(), options.horizon
        self.horizon.setToolTip("How far ahead the seqmoe policy forecasts and prefetches; the predictor sets the limit")
        self.horizon_note = QLabel(horizon_text(model))
        self.context = QSpinBox()
        self.context.setRange(*CONTEXT_TOKENS)
        self.context.setSingleStep(1024)
        self.context.setGroupSeparatorShown(True)
        self.context.setSuffix(" tokens")
        self.context.setValue(options.context_tokens)
        self.context.setToolTip("Prompt and reply together; longer chats leave out their oldest turns. The VRAM budget "
                                "sets aside the KV cache for this many tokens. Takes effect when a model is next loaded")
        self.context_note = QLabel(context_text(model))
        self.budget = BudgetSlider(model, context.available_bytes, self.speeds_for(options.policy),
                                   options.vram_budget_gb, options.cache_ratio, context.automatic_bytes)
        self.policy.currentIndexChanged.connect(self._on_policy_changed)
        self.link_setup.currentIndexChanged.connect(self._on_link_changed)
        layout = QFormLayout(self)
        layout.addRow("Device", self.device)
        layout.addRow("Cache policy", self.policy)
        layout.addRow("Emulated link", _with_note(self.link_setup, self.link_note, self.link))
        layout.addRow("Prediction horizon", _with_note(self.horizon, self.horizon_note))
        layout.addRow("Context", _with_note(self.context, self.context_note))
        layout.addRow(self.budget)
        self._on_policy_changed()
        self._on_link_changed()

    def refusal(self) -> str | None:
        """Why these settings cannot be kept, if they cannot (saved, every start would fail to load
        the model): a budget too small for the loaded model's smallest cache (the full policy
        takes no budget), a CUDA GPU that PyTorch here cannot use."""
        if self.budget.too_small() and self.policy.currentData() != "full":
            return f"The VRAM budget is below the minimum {self.model.name} needs: raise it, or untick it."
        if self.device.currentData() == "cuda" and self.cuda is False:
            return "PyTorch here cannot use a CUDA GPU (no NVIDIA GPU, or a CPU-only build): choose automatic or the CPU."
        return None

    def apply_to(self, options: EngineOptions) -> None:
        options.device = str(self.device.currentData())
        options.policy = str(self.policy.currentData())
        options.link_setup = self.link_setup.currentData()
        options.link_gbps = round(self.link.value(), 2)
        # The predictor's whole reach is stored as "no limit", so a better predictor later is used fully.
        if self.horizon.value() == self._horizon_shown:
            options.horizon = self._horizon_saved
        else:
            options.horizon = None if self.horizon.value() >= self.horizon.maximum() else self.horizon.value()
        options.vram_budget_gb = self.budget.budget_gb()
        options.context_tokens = self.context.value()

    def _on_policy_changed(self) -> None:
        policy = str(self.policy.currentData())
        # The full policy keeps every expert resident: no budget sizes its cache.
        self.budget.setEnabled(policy != "full")
        self.horizon.setEnabled(policy == "seqmoe" and self.horizon.maximum() > 1)
        self.budget.set_speeds(self.speeds_for(policy))

    def _on_link_changed(self) -> None:
        self.link.setEnabled(self.link_setup.currentData() is None)


def horizon_text(model: ModelInfo | None) -> str:
    if model is None:
        return "shown once a model is loaded"
    if model.predictor_horizon is None:
        return f"none: the {model.policy} policy does not forecast"
    layers = "layer" if model.predictor_horizon == 1 else "layers"
    if model.max_horizon == 1:
        return (f"now {model.predictor_horizon} MoE {layers} ahead with the {model.policy} policy; without a "
                "calibrated predictor the seqmoe policy forecasts one layer and runs at about lru's speed "
                "(calibrate the model in Models…)")
    return f"now {model.predictor_horizon} MoE {layers} ahead with the {model.policy} policy; this model's predictor reaches {model.max_horizon}"


def setup_text(setup: Setup) -> str:
    return f"as {setup.hardware.description} with {setup.shape.description} experts: a copy takes {setup.transfer_to_compute:.1f} layers"


def link_text(model: ModelInfo | None) -> str:
    if model is None:
        return "shown once a model is loaded"
    if model.link != "emulated":
        return f"unused: {model.name} copies over {model.link}"
    if model.link_setup is None:
        return f"{model.name} copies at the fixed speed"
    copy_layers = SETUPS[model.link_setup].transfer_to_compute
    return f"now {model.link_gbps:.3g} GB/s: one expert copy takes {copy_layers:.1f} layers of {model.name}'s decode, timed here"


def context_text(model: ModelInfo | None) -> str:
    if model is None or not model.context_tokens:
        return "shown once a model is loaded"
    limit = ": the model's own limit" if model.context_tokens == model.context_limit else ""
    return f"{model.name} now holds {model.context_tokens:,} tokens{limit}; the VRAM budget includes their KV cache"


def _with_note(field: QWidget, note: QLabel, *more: QWidget) -> QWidget:
    """``field`` (and any ``more`` fields) with a wrapped line of explanation under it, as one form row."""
    note.setWordWrap(True)
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in (field, *more, note):
        layout.addWidget(widget)
    return box


def _combo(names: dict[str, str], values: tuple[str, ...], current: str) -> QComboBox:
    combo = QComboBox()
    for value in values:
        combo.addItem(names[value], value)
    combo.setCurrentIndex(max(combo.findData(current), 0))
    return combo
