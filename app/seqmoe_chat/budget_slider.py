"""The VRAM budget: a slider in GB and, live, what it buys with the loaded model: expert
slots, cache ratio, the speed measured at that size, and whether the model fits entirely,
runs offloaded with SeqMoE, or cannot run at all. The arithmetic is the engine's own
(``CacheGeometry``), so the slots shown are the slots the engine will make."""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QSlider, QWidget

from .store.speed_history import expected_speed
from .worker import ModelInfo

GB = 2**30  # the engine's budgets count GB as 2**30 bytes
MB_STEP = GB // 1000
MAX_GB_WITHOUT_MODEL = 1024.0


class BudgetSlider(QWidget):
    changed = Signal()
    """The budget, or whether one is used, changed."""

    def __init__(self, model: ModelInfo | None, available_bytes: int | None, speeds: dict[int, float],
                 budget_gb: float | None, cache_ratio: float, automatic_bytes: int | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.cache_ratio = cache_ratio
        self.automatic_bytes = automatic_bytes
        self.speeds = speeds
        geometry = model.geometry if model is not None else None
        self.enabled_box = QCheckBox("Size the expert cache by a VRAM budget")
        self.enabled_box.setToolTip(
            "Unchecked: on a CUDA GPU the cache takes what the free VRAM holds when the model loads, up to "
            f"every expert; on the CPU (emulated GPU) it holds {cache_ratio:.0%} of the experts"
        )
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.spin = _SlotSpinBox(self.slider)
        self.spin.setSuffix(" GB")
        self.spin.setToolTip("GB of 2³⁰ bytes, as the engine counts: weights, KV-cache reserve, workspace and experts")
        self.slots = QLabel()
        self.speed = QLabel()
        self.fit = QLabel()
        self.fit.setWordWrap(True)
        if geometry is None:
            # Without a model only the number can be chosen; what it buys shows once one is loaded.
            self.unit, self.origin = MB_STEP, 0
            low, high = MB_STEP, int((available_bytes or MAX_GB_WITHOUT_MODEL * GB))
            initial = budget_gb if budget_gb is not None else high / GB
        else:
            full = geometry.budget_bytes_for(geometry.total_experts)
            low = geometry.budget_bytes_for(0)
            if geometry.bytes_per_expert < MB_STEP:
                # One expert per step, counted from the budget of no slot, so that each step buys one more.
                self.unit, self.origin = geometry.bytes_per_expert, low
            else:
                self.unit, self.origin = MB_STEP, 0
            high = max(min(available_bytes, full) if available_bytes else full, low + self.unit)
            initial = budget_gb
        per_expert = self.unit < MB_STEP
        # Enough decimals that the last one is finer than one step: every step then shows its own value.
        self.spin.setDecimals(math.ceil(math.log10(GB / self.unit)) if per_expert else 3)
        self.spin.steps_slider = per_expert
        self.spin.setRange(self._shown_gb(low), self._shown_gb(high))
        if initial is None:
            initial = self._shown_gb(geometry.budget_bytes_for(model.cache_slots))
        # The arrows' steps where they do not move the slider: 0.05 GB on a real GPU budget, 0.001 GB
        # when the whole range is small.
        self.spin.setSingleStep(0.05 if high - low >= GB // 2 else MB_STEP / GB)
        self.slider.setRange(self._position(low), self._position(high))
        self.slider.setPageStep(max(1, round(0.05 * GB / self.unit)))
        self.slider.setEnabled(geometry is not None)
        self.spin.setValue(initial)  # within the range the spin box holds
        # A saved budget outside what this model's range shows (chosen for a larger model) is
        # kept unless the user changes it, as the box shows it only clamped.
        self._saved_gb, self._shown_at_start = budget_gb, self.spin.value()
        self.slider.setValue(self._position(int(self.spin.value() * GB)))
        self.slider.valueChanged.connect(self._on_slider_moved)
        self.spin.valueChanged.connect(self._on_spin_changed)
        self.enabled_box.toggled.connect(self._update)
        self.enabled_box.setChecked(budget_gb is not None)

        row = QHBoxLayout()
        row.addWidget(self.slider, 1)
        row.addWidget(self.spin)
        layout = QFormLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addRow(self.enabled_box)
        layout.addRow("Budget", row)
        layout.addRow("Expert slots", self.slots)
        layout.addRow("Expected speed", self.speed)
        layout.addRow("", self.fit)
        self._update()

    def budget_gb(self) -> float | None:
        """The chosen budget; None when the cache is sized by its ratio instead."""
        if not self.enabled_box.isChecked():
            return None
        if self._saved_gb is not None and self.spin.value() == self._shown_at_start:
            return self._saved_gb
        return round(self.spin.value(), self.spin.decimals())

    def too_small(self) -> bool:
        """Whether the chosen budget cannot hold the loaded model's smallest cache: saved, the
        model would fail to load with it at every start."""
        geometry = self.model.geometry if self.model is not None else None
        return (self.enabled_box.isChecked() and geometry is not None
                and int(self.spin.value() * GB) < geometry.budget_bytes_for(geometry.minimum_slots))

    def set_speeds(self, speeds: dict[int, float]) -> None:
        self.speeds = speeds
        self._update()

    def _position(self, budget_bytes: int) -> int:
        """The slider step a budget reaches, rounded down as the engine rounds slots down."""
        return (budget_bytes - self.origin) // self.unit

    def _shown_gb(self, budget_bytes: int) -> float:
        """``budget_bytes`` in GB at the spin box's decimals, rounded up so that the engine, which reads
        ``int(gb * 2**30)`` bytes, gets at least that budget and so its slots."""
        scale = 10 ** self.spin.decimals()
        shown = math.ceil(budget_bytes * scale / GB) / scale
        return shown if int(shown * GB) >= budget_bytes else shown + 1 / scale

    def _on_slider_moved(self, value: int) -> None:
        self.spin.blockSignals(True)
        self.spin.setValue(self._shown_gb(self.origin + value * self.unit))
        self.spin.blockSignals(False)
        self._update()

    def _on_spin_changed(self, value: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(self._position(int(value * GB)))
        self.slider.blockSignals(False)
        self._update()

    def _update(self) -> None:
        on = self.enabled_box.isChecked()
        self.slider.setEnabled(on and self.model is not None and self.model.geometry is not None)
        self.spin.setEnabled(on)
        if on:
            slots, speed, fit = describe_budget(self.model, int(self.spin.value() * GB), self.speeds)
        elif self.automatic_bytes is not None:
            slots, speed, fit = describe_budget(self.model, self.automatic_bytes, self.speeds)
            slots = f"{slots}, sized to the free VRAM"
        elif self.model is not None and self.model.geometry is not None:
            slots, speed, fit = describe_slots(self.model, round(self.cache_ratio * self.model.total_experts),
                                               self.speeds)
        else:
            slots, speed, fit = describe_budget(None, 0, self.speeds)
        self.slots.setText(slots)
        self.speed.setText(speed)
        self.fit.setText(fit)
        self.changed.emit()


class _SlotSpinBox(QDoubleSpinBox):
    """With one expert per slider step, the arrows move the slider one step: adding the step in GB
    and rounding to the decimals would sometimes land on the slot count it left."""

    def __init__(self, slider: QSlider) -> None:
        super().__init__()
        self.slider = slider
        self.steps_slider = False

    def stepBy(self, steps: int) -> None:
        if self.steps_slider:
            self.slider.setValue(self.slider.value() + steps * self.slider.singleStep())
        else:
            super().stepBy(steps)


def describe_budget(model: ModelInfo | None, budget_bytes: int, speeds: dict[int, float]) -> tuple[str, str, str]:
    """Texts for the expert slots, the expected speed and the fit that ``budget_bytes`` gives ``model``."""
    if model is None or model.geometry is None:
        return "load a model to see what a budget buys", "not measured yet", ""
    from seqmoe import BudgetTooSmall  # loaded with the model already

    geometry = model.geometry
    try:
        slots = geometry.slots_for_budget(budget_bytes)
    except BudgetTooSmall:
        need = geometry.budget_bytes_for(geometry.minimum_slots) / GB
        return (f"below the minimum of {geometry.minimum_slots}", "–",
                f"Too small: {model.name} needs at least {need:.4f} GB.")
    return describe_slots(model, slots, speeds)


def describe_slots(model: ModelInfo, slots: int, speeds: dict[int, float]) -> tuple[str, str, str]:
    total = model.total_experts
    estimate = expected_speed(speeds, slots)
    speed = "not measured yet" if estimate is None else f"about {estimate.tokens_per_s:.1f} tok/s ({estimate.basis})"
    if slots == total:
        fit = "Fits entirely: every expert stays in VRAM."
    else:
        fit = f"Runs with SeqMoE: {slots / total:.0%} of the experts cached, the rest loaded when needed."
    return f"{slots} of {total} (cache ratio {slots / total:.2f})", speed, fit
