"""The settings file, without Qt: round trip, atomic replacement, migration from the chat
database's settings table (schema 1), tolerance of bad values, and where the file lives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seqmoe_chat.paths import CONFIG_DIR_ENV, config_dir
from seqmoe_chat.store import EngineOptions, SamplingSettings, Settings, SettingsStore, open_database
from seqmoe_chat.store.settings import DEFAULT_LINK_SETUP, SCHEMA_VERSION, SETTINGS_FORMAT, SETTINGS_NAME


def test_round_trip_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "config" / SETTINGS_NAME
    settings = Settings(theme="dark", sampling=SamplingSettings(temperature=0.0, seed=3), window_geometry="AAAA",
                        engine=EngineOptions(policy="seqmoe", vram_budget_gb=0.085, link_setup=None, link_gbps=2.5),
                        panel_hz=4)
    settings.remember_model("/models/a")
    settings.remember_model("/models/b")
    SettingsStore(path).save(settings)
    stored = json.loads(path.read_text())
    assert stored["format"] == SETTINGS_FORMAT and stored["version"] == SCHEMA_VERSION
    loaded = SettingsStore(path).load()
    assert loaded == settings and loaded.recent_models == ["/models/b", "/models/a"]
    # Written atomically: no temporary file is left beside it.
    assert sorted(p.name for p in path.parent.iterdir()) == [SETTINGS_NAME]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / SETTINGS_NAME
    store = SettingsStore(path)
    store.save(Settings(theme="dark"))

    def full_disk(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        store.save(Settings(theme="light"))
    monkeypatch.undo()
    assert SettingsStore(path).load().theme == "dark"
    assert sorted(p.name for p in tmp_path.iterdir()) == [SETTINGS_NAME]


def test_version_1_in_the_chat_database_migrates_to_the_file(tmp_path: Path) -> None:
    connection = open_database(tmp_path / "chats.sqlite3").connection
    version_1 = {
        "theme": "light",
        "sampling": {"temperature": 0.2, "top_p": 0.8, "max_new_tokens": 64, "seed": 5},
        "engine": {"device": "cpu", "policy": "gate", "cache_ratio": 0.6},
        "model": "/models/x",
        "recent_models": ["/models/x"],
        "window_geometry": "GGGG",
        "window_state": "SSSS",
        "splitter_state": "PPPP",
    }
    connection.executemany("INSERT INTO settings (key, value) VALUES (?, ?)",
                           [(key, json.dumps(value)) for key, value in version_1.items()])
    path = tmp_path / "config" / SETTINGS_NAME
    settings = SettingsStore(path, connection).load()
    assert settings.theme == "light" and settings.model == "/models/x" and settings.window_state == "SSSS"
    assert settings.sampling == SamplingSettings(temperature=0.2, top_p=0.8, max_new_tokens=64, seed=5)
    # New in version 2: the cache is still sized by the old ratio, on the default link (version 3's:
    # matched to the default setup).
    assert settings.engine == EngineOptions(device="cpu", policy="gate", cache_ratio=0.6, vram_budget_gb=None,
                                            link_gbps=25.0)
    assert settings.engine.cache_size() == {"cache_ratio": 0.6}
    assert json.loads(path.read_text())["version"] == SCHEMA_VERSION
    # From now on the file wins over the old table.
    connection.execute("UPDATE settings SET value = '\"dark\"' WHERE key = 'theme'")
    assert SettingsStore(path, connection).load().theme == "light"


@pytest.mark.parametrize("engine", ['"fast"', "[1, 2]"])
def test_an_old_settings_table_whose_group_is_no_group_keeps_its_defaults_and_the_rest(tmp_path: Path, engine: str) -> None:
    # It stopped every start with a traceback, in the migration.
    connection = open_database(tmp_path / "chats.sqlite3").connection
    connection.executemany("INSERT INTO settings (key, value) VALUES (?, ?)",
                           [("theme", '"light"'), ("engine", engine), ("sampling", '{"temperature": 0.2}')])
    settings = SettingsStore(tmp_path / SETTINGS_NAME, connection).load()
    assert settings.theme == "light" and settings.sampling.temperature == 0.2
    assert settings.engine == Settings().engine

def test_a_migration_the_folder_cannot_take_still_gives_the_migrated_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = open_database(tmp_path / "chats.sqlite3").connection
    connection.execute("INSERT INTO settings (key, value) VALUES ('theme', '\"light\"')")

    def full_disk(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    path = tmp_path / SETTINGS_NAME
    assert SettingsStore(path, connection).load().theme == "light"
    monkeypatch.undo()
    assert not path.exists() and SettingsStore(path, connection).load().theme == "light" and path.exists()


@pytest.mark.parametrize(("link_gbps", "setup"), [(25.0, DEFAULT_LINK_SETUP), (2.5, None)])
def test_version_2s_default_link_follows_the_default_setup_and_a_chosen_speed_stays(
    tmp_path: Path, link_gbps: float, setup: str | None
) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({"format": SETTINGS_FORMAT, "version": 2, "theme": "dark",
                                "engine": {"policy": "lru", "link_gbps": link_gbps}}))
    settings = SettingsStore(path).load()
    assert settings.theme == "dark"
    assert settings.engine == EngineOptions(policy="lru", link_setup=setup, link_gbps=link_gbps)
    assert json.loads(path.read_text())["version"] == SCHEMA_VERSION


def test_unknown_and_wrong_values_keep_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({
        "format": SETTINGS_FORMAT, "version": SCHEMA_VERSION, "theme": "purple", "from_a_later_version": 1,
        "panel_hz": 500, "engine": {"policy": "magic", "vram_budget_gb": -1, "link_gbps": "fast", "cache_ratio": 0.3,
                   "link_setup": 42,
                   "context_tokens": 10},
    }))
    settings = SettingsStore(path).load()
    assert settings.theme == "system" and settings.panel_hz == Settings().panel_hz
    assert settings.engine == EngineOptions(cache_ratio=0.3)


@pytest.mark.parametrize("sampling, kept", [
    ({"temperature": "hot", "top_p": None, "max_new_tokens": 1e400, "seed": "abc"}, {}),
    ({"temperature": float("nan"), "top_p": -3, "max_new_tokens": -10, "seed": True}, {}),
    ({"temperature": 0, "top_p": 1, "max_new_tokens": 2.5, "seed": 7}, {"temperature": 0.0, "top_p": 1.0, "seed": 7}),
])
def test_sampling_values_of_the_wrong_type_or_out_of_range_keep_their_defaults(
    tmp_path: Path, sampling: dict, kept: dict
) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({"format": SETTINGS_FORMAT, "version": SCHEMA_VERSION, "theme": "dark",
                                "sampling": sampling, "engine": {"vram_budget_gb": float("inf")}}))
    settings = SettingsStore(path).load()
    assert settings.sampling == SamplingSettings(**kept) and settings.theme == "dark"
    assert settings.engine.vram_budget_gb is None


@pytest.mark.parametrize("content", [
    "{not json", json.dumps({"format": "something else", "version": 1}), "[]",
    # Each of these, of the wrong shape, stopped the app at its start.
    json.dumps({"format": SETTINGS_FORMAT, "version": 2, "engine": "fast"}),
    json.dumps({"format": SETTINGS_FORMAT, "version": 1, "engine": 5}),
    json.dumps({"format": SETTINGS_FORMAT, "version": SCHEMA_VERSION, "sampling": [0.7]}),
    f'{{"format": "{SETTINGS_FORMAT}", "version": {SCHEMA_VERSION}, "panel_hz": {"9" * 5000}}}',
    "[" * 100_000,
])
def test_a_damaged_or_foreign_file_gives_the_defaults_and_is_kept_aside(tmp_path: Path, content: str) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(content)
    store = SettingsStore(path)
    assert store.load() == Settings()
    (kept,) = tmp_path.glob(f"{SETTINGS_NAME}.broken-*")
    assert kept.read_text() == content and kept.name in store.notice and "defaults" in store.notice
    store.save(Settings(theme="dark"))
    assert kept.read_text() == content


@pytest.mark.parametrize("engine", [
    {"context_tokens": 2**31}, {"context_tokens": 2**20 + 1}, {"horizon": 2**31}, {"horizon": 10**12},
    {"link_gbps": 1e6}, {"link_gbps": 0.001},
    # The engine refused it at every load; the dialog showed the slider's top and saved it back.
    {"vram_budget_gb": 1e300}, {"vram_budget_gb": 1024.5},
])
def test_engine_values_beyond_the_settings_dialogs_ranges_keep_their_defaults(tmp_path: Path, engine: dict) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({"format": SETTINGS_FORMAT, "version": SCHEMA_VERSION, "engine": engine}))
    assert SettingsStore(path).load().engine == EngineOptions()


def test_a_budget_up_to_the_sliders_top_is_kept(tmp_path: Path) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({"format": SETTINGS_FORMAT, "version": SCHEMA_VERSION, "engine": {"vram_budget_gb": 1024}}))
    assert SettingsStore(path).load().engine.vram_budget_gb == 1024


def test_a_newer_file_still_gives_the_values_this_version_knows(tmp_path: Path) -> None:
    path = tmp_path / SETTINGS_NAME
    path.write_text(json.dumps({"format": SETTINGS_FORMAT, "version": SCHEMA_VERSION + 1, "theme": "dark"}))
    assert SettingsStore(path).load().theme == "dark"


def test_budget_sizes_the_cache_unless_the_policy_keeps_everything() -> None:
    assert EngineOptions(vram_budget_gb=1.5).cache_size() == {"vram_budget_gb": 1.5}
    assert EngineOptions(policy="full", vram_budget_gb=1.5).cache_size() == {"cache_ratio": 1.0}


def test_without_a_budget_of_the_users_a_gpu_cache_takes_the_free_vram_and_the_cpu_the_ratio() -> None:
    assert EngineOptions().cache_size(device_budget_gb=20.5) == {"vram_budget_gb": 20.5}
    assert EngineOptions(vram_budget_gb=1.5).cache_size(device_budget_gb=20.5) == {"vram_budget_gb": 1.5}
    assert EngineOptions(policy="full").cache_size(device_budget_gb=20.5) == {"cache_ratio": 1.0}
    assert EngineOptions(cache_ratio=0.3).cache_size(device_budget_gb=None) == {"cache_ratio": 0.3}


def test_the_settings_file_lives_with_a_chosen_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_dir(tmp_path / "profile") == tmp_path / "profile"
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "elsewhere"))
    assert config_dir(tmp_path / "profile") == tmp_path / "elsewhere"
