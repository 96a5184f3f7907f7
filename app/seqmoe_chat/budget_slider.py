"""The VRAM budget: a slider in GiB and, live, what it buys with the loaded model: expert
slots, cache ratio, the speed measured at that size, and whether the model fits entirely,
runs offloaded with SeqMoE, or cannot run at all. The arithmetic is the engine's own
(``CacheGeometry``), so the slots shown are the slots the engine will make."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel, QSlider, QWidget
from seqmoe.gib import GIB, gib_rounded_up

from .store.settings import MAX_VRAM_BUDGET_GB
from .store.speed_history import expected_speed
from .worker import ModelInfo

if TYPE_CHECKING:
    from seqmoe.budget import CacheGeometry

MB_STEP = GIB // 1000
MAX_BYTES = int(MAX_VRAM_BUDGET_GB * GIB)
SLIDER_STEPS = 2**31 - 1  # a QSlider's int


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
        geometry = sized_geometry(model)
        self.enabled_box = QCheckBox("Size the expert cache by a VRAM budget")
        self.enabled_box.setToolTip(
            "Unchecked: on a CUDA GPU the cache takes what the free VRAM holds when the model loads, up to "
            f"every expert; on the CPU (emulated GPU) it holds {cache_ratio:.0%} of the experts"
        )
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.spin = _SlotSpinBox(self.slider)
        self.spin.setSuffix(" GiB")
        self.spin.setToolTip("GiB of 2³⁰ bytes: weights, KV-cache reserve, workspace and experts")
        self.slots = QLabel()
        self.speed = QLabel()
        self.fit = QLabel()
        self.fit.setWordWrap(True)
        cap = min(available_bytes or MAX_BYTES, MAX_BYTES)
        if geometry is None:
            # Without a model only the number can be chosen; what it buys shows once one is loaded.
            self.unit, self.origin = MB_STEP, 0
            low, high = MB_STEP, cap
            initial = budget_gb if budget_gb is not None else high / GIB
        else:
            least = geometry.budget_bytes_for(0)
            ceiling = min(geometry.budget_bytes_for(geometry.total_experts), cap)
            if geometry.bytes_per_expert < MB_STEP and (ceiling - least) // geometry.bytes_per_expert < SLIDER_STEPS:
                # One expert per step, counted from the budget of no slot, so that each step buys one more.
                self.unit, self.origin = geometry.bytes_per_expert, least
                low = least
            else:
                # A model that no budget the settings keep holds shows as too small at every step.
                self.unit, self.origin = MB_STEP, 0
                low = min(least, MAX_BYTES - MB_STEP)
            high = max(ceiling, low + self.unit)
            initial = budget_gb
        self._high = high
        per_expert = self.unit < MB_STEP
        # Enough decimals that the last one is finer than one step: every step then shows its own value.
        self.spin.setDecimals(math.ceil(math.log10(GIB / self.unit)) if per_expert else 3)
        self.spin.steps_slider = per_expert
        self.spin.setRange(self._shown_gb(low), self._shown_gb(high))
        # The right end is the first step whose budget reaches the top of the range (every expert,
        # if it holds them): the steps below it are rounded down.
        below = (high - self.origin) // self.unit
        self._top = below if int(self._shown_gb(self.origin + below * self.unit) * GIB) >= high else below + 1
        if initial is None:
            initial = self._shown_gb(geometry.budget_bytes_for(model.cache_slots))
        # The arrows' steps where they do not move the slider: 0.05 GiB on a real GPU budget, 0.001 GiB
        # when the whole range is small.
        self.spin.setSingleStep(0.05 if high - low >= GIB // 2 else MB_STEP / GIB)
        self.slider.setRange(self._position(low), self._top)
        self.slider.setPageStep(max(1, round(0.05 * GIB / self.unit)))
        self.slider.setEnabled(geometry is not None)
        self.spin.setValue(initial)  # within the range the spin box holds
        # A saved budget outside what this model's range shows (chosen for a larger model) is
        # kept unless the user changes it, as the box shows it only clamped.
        self._saved_gb, self._shown_at_start = budget_gb, self.spin.value()
        self.slider.setValue(self._position(int(self.spin.value() * GIB)))
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
        geometry = sized_geometry(self.model)
        return (self.enabled_box.isChecked() and geometry is not None
                and int(self.spin.value() * GIB) < geometry.budget_bytes_for(geometry.minimum_slots))

    def set_speeds(self, speeds: dict[int, float]) -> None:
        self.speeds = speeds
        self._update()

    def _position(self, budget_bytes: int) -> int:
        """The slider step a budget reaches, rounded down as the engine rounds slots down; the range's
        top is the last step."""
        if budget_bytes >= self._high:
            return self._top
        return (budget_bytes - self.origin) // self.unit

    def _shown_gb(self, budget_bytes: int) -> float:
        return gib_rounded_up(budget_bytes, self.spin.decimals())

    def _on_slider_moved(self, value: int) -> None:
        self.spin.blockSignals(True)
        self.spin.setValue(self._shown_gb(min(self.origin + value * self.unit, self._high)))
        self.spin.blockSignals(False)
        self._update()

    def _on_spin_changed(self, value: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(self._position(int(value * GIB)))
        self.slider.blockSignals(False)
        self._update()

    def _update(self) -> None:
        on = self.enabled_box.isChecked()
        self.slider.setEnabled(on and sized_geometry(self.model) is not None)
        self.spin.setEnabled(on)
        if on:
            slots, speed, fit = describe_budget(self.model, int(self.spin.value() * GIB), self.speeds)
        elif self.automatic_bytes is not None:
            slots, speed, fit = describe_budget(self.model, self.automatic_bytes, self.speeds)
            slots = f"{slots}, sized to the free VRAM"
        elif sized_geometry(self.model) is not None:
            slots, speed, fit = describe_slots(self.model, round(self.cache_ratio * self.model.total_experts),
                                               self.speeds)
        else:
            slots, speed, fit = describe_budget(None, 0, self.speeds)
        self.slots.setText(slots)
        self.speed.setText(speed)
        self.fit.setText(fit)
        self.changed.emit()


class _SlotSpinBox(QDoubleSpinBox):
    """With one expert per slider step, the arrows move the slider one step: adding the step in GiB
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
    geometry = sized_geometry(model)
    if geometry is None:
        return "load a model to see what a budget buys", "not measured yet", ""
    from seqmoe import BudgetTooSmall  # loaded with the model already

    try:
        slots = geometry.slots_for_budget(budget_bytes)
    except BudgetTooSmall:
        need = gib_text(geometry.budget_bytes_for(geometry.minimum_slots))
        return f"below the minimum of {geometry.minimum_slots}", "–", f"Too small: {model.name} needs at least {need} GiB."
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


def sized_geometry(model: ModelInfo | None) -> CacheGeometry | None:
    """The loaded model's cache arithmetic; None without a model, or for one whose experts measured no
    bytes (no budget buys a count of them)."""
    if model is None or model.geometry is None or model.geometry.bytes_per_expert <= 0:
        return None
    return model.geometry


def gib_text(size: int) -> str:
    """``size`` bytes in GiB, rounded up, with the budget box's 3 decimals or as many more as show
    3 significant digits (a tiny model's budget is a millionth of a GiB)."""
    decimals = max(3, 2 - math.floor(math.log10(size / GIB))) if size > 0 else 3
    return f"{gib_rounded_up(size, decimals):.{decimals}f}"
