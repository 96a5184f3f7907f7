"""The status bar: the model, its device, the speed and cache hit rate of the last reply."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from .tooltips import plain_tooltip
from .transcripts.reply_stats import generating
from .worker import ModelInfo


class StatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = QLabel()
        self.device = QLabel()
        self.speed = QLabel()
        self.hit_rate = QLabel()
        for label in (self.model, self.device, self.speed, self.hit_rate):
            label.setContentsMargins(8, 0, 8, 0)
            self.addPermanentWidget(label)
        self.show_model(None)

    def show_model(self, info: ModelInfo | None, loading: str = "") -> None:
        if info is None:
            self.model.setText(loading or "No model loaded")
            self.device.setText("")
            self.model.setToolTip("")
            return
        self.model.setText(info.name)
        self.model.setToolTip(plain_tooltip(f"{info.path}\n{info.architecture}, policy {info.policy}, "
                                            f"cache {info.cache_slots}/{info.total_experts} experts"))
        self.device.setText(info.device)

    def show_speed(self, tokens: int, seconds: float) -> None:
        """Live speed while a reply streams."""
        if seconds > 0:
            self.speed.setText(f"{tokens / seconds:.1f} tok/s")

    def show_reply_stats(self, stats: dict[str, Any]) -> None:
        if not stats:
            return
        speed, hit_rate = generating(stats)
        self.speed.setText(f"{speed or 0.0:.1f} tok/s")
        reused = stats.get("reused_prompt_tokens", 0)
        prompt = (f" (of the prompt's {stats.get('prompt_tokens', 0)} tokens, {reused} came with the last reply's "
                  f"cache)" if reused else "")
        self.speed.setToolTip(
            f"{stats.get('tokens', 0)} tokens, first after {stats.get('time_to_first_token', 0.0):.2f} s{prompt}, "
            f"the rest at this speed; longest pause of the window while generating: {stats.get('gui_stall_ms', 0.0):.0f} ms"
        )
        self.hit_rate.setText(f"hit rate {hit_rate or 0.0:.1%}")
        self.hit_rate.setToolTip(f"expert cache while generating; the whole reply with its prompt: {stats.get('hits', 0)} "
                                 f"hits, {stats.get('misses', 0)} misses, stalls {stats.get('stall_seconds', 0.0):.3f} s")
