"""The app's settings: one JSON file with a schema version, in the platform's config folder.

The file is replaced atomically (temporary file, then ``os.replace``), so it is never half
written. Every older layout has an explicit migration to the next one:

1. The settings table of the chat database (``chats.sqlite3``), one JSON value per key.
2. ``settings.json``; the engine options gain a VRAM budget and the emulated link speed,
   and the live panel its sampling rate.
3. The emulated link imitates a consumer setup (``link_setup``) unless it runs at a speed
   the user chose.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..models.json_file import set_aside, write_json
from .records import SamplingSettings, is_number, within

log = logging.getLogger(__name__)

SETTINGS_NAME = "settings.json"
SETTINGS_FORMAT = "seqmoe-chat-settings"
SCHEMA_VERSION = 3
THEMES = ("system", "light", "dark")
DEVICES = ("auto", "cuda", "cpu")
POLICIES = ("seqmoe", "gate", "lru", "full")
RECENT_MODELS = 8
DEFAULT_LINK_GBPS = 25.0  # the engine's own default for the emulated link, the fixed speed before version 3
DEFAULT_LINK_SETUP = "rtx4090-pcie4-olmoe"  # seqmoe.hardware.DEFAULT_SETUP, named here without importing the engine
DEFAULT_CONTEXT_TOKENS = 4096  # the engine's own default (seqmoe.budget)
CONTEXT_TOKENS = (256, 2**20)
"""The settings dialog's range; beyond a model's own limit the engine holds that limit."""
LINK_GBPS = (0.01, 1000.0)
MAX_VRAM_BUDGET_GB = 1024.0
"""The budget slider's top, in GiB (2**30 bytes, as the engine counts): more than any GPU holds.
A larger budget read from the file is dropped: the dialog would show its top and save it back."""
MAX_HORIZON = 2**31 - 1  # a spin box's int; the engine forecasts no farther than the predictor anyway
PANEL_HZ = (1, 10)  # the live panel refreshes at most 10 times a second
# Measured with tools/measure_panel.py: at 10 a second the panel cost the GUI thread about 6% of a
# core, at 5 about 4%.
DEFAULT_PANEL_HZ = 5


@dataclass
class EngineOptions:
    """How the worker opens a model and sizes its expert cache."""

    device: str = "auto"
    policy: str = "seqmoe"  # the predictor-driven cache; "lru" etc. for comparison
    cache_ratio: float = 0.45
    vram_budget_gb: float | None = None  # when set, the cache is sized by this budget instead of the ratio
    # Machines without a CUDA GPU: the emulated link copies an expert in as many layers of decode as
    # on this consumer setup (seqmoe.hardware.SETUPS), timed when a model loads; None: at link_gbps.
    link_setup: str | None = DEFAULT_LINK_SETUP
    link_gbps: float = DEFAULT_LINK_GBPS  # the emulated link's speed when it follows no setup
    horizon: int | None = None  # MoE layers the seqmoe policy forecasts ahead; None: as far as its predictor sees
    context_tokens: int = DEFAULT_CONTEXT_TOKENS  # prompt and reply; the VRAM budget sets aside their KV cache

    def cache_size(self, device_budget_gb: float | None = None) -> dict[str, float]:
        """The keyword that sizes the cache in ``Engine.configure`` and ``Engine.resize``.

        Without a budget of the user's, a CUDA device's cache takes what its free memory
        allows (``device_budget_gb``: ``Engine.free_memory_budget_gb``), up to every expert; the cache ratio
        applies where there is no such memory to measure (the CPU's emulated GPU).
        """
        if self.policy == "full":
            return {"cache_ratio": 1.0}
        if self.vram_budget_gb is not None:
            return {"vram_budget_gb": self.vram_budget_gb}
        if device_budget_gb is not None:
            return {"vram_budget_gb": device_budget_gb}
        return {"cache_ratio": self.cache_ratio}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineOptions:
        options, defaults = cls(), cls()
        known = {f.name for f in fields(cls)}
        for key, value in values.items():
            if key in known:
                setattr(options, key, value)
        if options.device not in DEVICES:
            options.device = defaults.device
        if options.policy not in POLICIES:
            options.policy = defaults.policy
        if not is_number(options.cache_ratio) or not 0 < options.cache_ratio <= 1:
            options.cache_ratio = defaults.cache_ratio
        if options.vram_budget_gb is not None and not (
                is_number(options.vram_budget_gb) and 0 < options.vram_budget_gb <= MAX_VRAM_BUDGET_GB):
            options.vram_budget_gb = None
        if options.link_setup is not None and not isinstance(options.link_setup, str):
            options.link_setup = defaults.link_setup
        # Within what the settings dialog's spin boxes hold: one past a C int would stop it opening.
        options.link_gbps = within(options.link_gbps, LINK_GBPS, defaults.link_gbps, float)
        if options.horizon is not None:
            options.horizon = within(options.horizon, (1, MAX_HORIZON), defaults.horizon, int)
        options.context_tokens = within(options.context_tokens, CONTEXT_TOKENS, defaults.context_tokens, int)
        return options


@dataclass
class Settings:
    theme: str = "system"
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    engine: EngineOptions = field(default_factory=EngineOptions)
    model: str = ""  # a folder or hub id; empty: the bundled demo model
    recent_models: list[str] = field(default_factory=list)
    panel_hz: int = DEFAULT_PANEL_HZ
    window_geometry: str = ""  # Qt's saveGeometry(), base64
    window_state: str = ""
    splitter_state: str = ""

    def remember_model(self, model: str) -> None:
        if model:
            self.recent_models = [model] + [m for m in self.recent_models if m != model][: RECENT_MODELS - 1]
        self.model = model

    def forget_model(self, model: str) -> None:
        """``model``'s files are gone: it is no longer listed, nor opened at the start (the demo is)."""
        self.recent_models = [m for m in self.recent_models if m != model]
        if self.model == model:
            self.model = ""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Settings:
        """Settings from stored values of the current schema; a wrong or unknown value keeps its default."""
        settings = cls()
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
        hz = values.get("panel_hz")
        if isinstance(hz, int) and PANEL_HZ[0] <= hz <= PANEL_HZ[1]:
            settings.panel_hz = hz
        return settings


GROUPS = ("sampling", "engine")
"""The settings that are groups of values."""


def _from_version_1(values: dict[str, Any]) -> dict[str, Any]:
    engine = dict(values.get("engine") or {})
    # Version 1 sized the cache by a ratio only, on the engine's default link.
    engine.setdefault("vram_budget_gb", None)
    engine.setdefault("link_gbps", DEFAULT_LINK_GBPS)
    return {**values, "engine": engine, "panel_hz": DEFAULT_PANEL_HZ}


def _from_version_2(values: dict[str, Any]) -> dict[str, Any]:
    engine = dict(values.get("engine") or {})
    # Version 2's emulated link ran at a fixed speed, the default one unless the user chose
    # another: the default now imitates a consumer setup, and a speed of the user's stays.
    chosen = engine.get("link_gbps", DEFAULT_LINK_GBPS) != DEFAULT_LINK_GBPS
    engine["link_setup"] = None if chosen else DEFAULT_LINK_SETUP
    return {**values, "engine": engine}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_version_1, 2: _from_version_2}
"""``MIGRATIONS[n]`` turns the values of schema ``n`` into those of ``n + 1``."""


def migrate(values: dict[str, Any], version: int) -> dict[str, Any]:
    for number in range(version, SCHEMA_VERSION):
        values = MIGRATIONS[number](values)
    return values


class SettingsStore:
    """``path`` is the settings file; ``legacy`` the chat database that held version 1."""

    def __init__(self, path: Path, legacy: sqlite3.Connection | None = None) -> None:
        self.path = path
        self.legacy = legacy
        self.notice: str | None = None
        """Said to the user at the start: the settings file could not be used, and where it went."""

    def load(self) -> Settings:
        values, version = self._read()
        settings = Settings.from_dict(migrate(values, version))
        if version < SCHEMA_VERSION:
            # Written once in the new layout; the old one is left as it was.
            try:
                self.save(settings)
            except OSError as error:  # read again, and migrated again, at the next start
                log.warning("%s could not be written in the new layout (%s)", self.path, error)
        return settings

    def save(self, settings: Settings) -> None:
        write_json(self.path, SETTINGS_FORMAT, SCHEMA_VERSION, asdict(settings))

    def _read(self) -> tuple[dict[str, Any], int]:
        """The stored values and their schema version; nothing stored reads as empty current values."""
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return self._read_legacy()
        # ValueError: bad UTF-8, bad JSON, or an integer of over 4,300 digits; RecursionError: nesting
        # deeper than the parser goes.
        except (OSError, ValueError, RecursionError) as error:
            return self._unusable(f"could not be read ({error})")
        version = stored.get("version") if isinstance(stored, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or stored.get("format") != SETTINGS_FORMAT or version < 1:
            return self._unusable("is not a settings file of this app")
        for group in GROUPS:
            # A wrong value keeps its default, but a group that is no group is no file of this app's
            # (and the migrations would take the engine's for one).
            if not isinstance(stored.get(group, {}), dict):
                return self._unusable(f'has "{group}": {stored[group]!r:.80}, not a group of settings')
        if version > SCHEMA_VERSION:
            # A newer app wrote it: the values this version knows still apply.
            log.warning("%s has schema %d, newer than this app's %d", self.path, version, SCHEMA_VERSION)
            return stored, SCHEMA_VERSION
        return stored, version

    def _unusable(self, why: str) -> tuple[dict[str, Any], int]:
        """Default settings; the file is kept aside (one slip in a hand edit must not cost the
        rest of it), and the user told."""
        self.notice = f"{self.path} {why}; {set_aside(self.path)}. The settings start from their defaults."
        log.warning("%s", self.notice)
        return {}, SCHEMA_VERSION

    def _read_legacy(self) -> tuple[dict[str, Any], int]:
        if self.legacy is None:
            return {}, SCHEMA_VERSION
        rows = self.legacy.execute("SELECT key, value FROM settings").fetchall()
        if not rows:
            return {}, SCHEMA_VERSION
        values = {}
        for key, value in rows:
            try:
                values[key] = json.loads(value)
            except (TypeError, ValueError, RecursionError):
                continue
            if key in GROUPS and not isinstance(values[key], dict):
                # Kept, its group taken for one, it stopped every start with a traceback.
                del values[key]
        return values, 1
