"""The app's settings, kept in the chat database so that they cannot be half-written."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .records import SamplingSettings
from .transactions import transaction

THEMES = ("system", "light", "dark")
RECENT_MODELS = 8


@dataclass
class EngineOptions:
    """How the worker opens a model. Only the defaults are used until the settings dialog
    grows its VRAM-budget page."""

    device: str = "auto"
    policy: str = "lru"
    cache_ratio: float = 0.45

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


@dataclass
class Settings:
    theme: str = "system"
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    engine: EngineOptions = field(default_factory=EngineOptions)
    model: str = ""  # a folder or hub id; empty: the bundled demo model
    recent_models: list[str] = field(default_factory=list)
    window_geometry: str = ""  # Qt's saveGeometry(), base64
    window_state: str = ""
    splitter_state: str = ""

    def remember_model(self, model: str) -> None:
        if model:
            self.recent_models = [model] + [m for m in self.recent_models if m != model][: RECENT_MODELS - 1]
        self.model = model


class SettingsStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def load(self) -> Settings:
        values = {key: json.loads(value) for key, value in self.connection.execute("SELECT key, value FROM settings")}
        settings = Settings()
        for name in ("model", "window_geometry", "window_state", "splitter_state"):
            if isinstance(values.get(name), str):
                setattr(settings, name, values[name])
        if values.get("theme") in THEMES:
            settings.theme = values["theme"]
        if isinstance(values.get("recent_models"), list):
            settings.recent_models = [str(model) for model in values["recent_models"]]
        if isinstance(values.get("sampling"), dict):
            settings.sampling = SamplingSettings.from_dict(values["sampling"])
        if isinstance(values.get("engine"), dict):
            settings.engine = EngineOptions.from_dict(values["engine"])
        return settings

    def save(self, settings: Settings) -> None:
        values = asdict(settings)
        with transaction(self.connection):
            self.connection.executemany(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(key, json.dumps(value)) for key, value in values.items()],
            )
