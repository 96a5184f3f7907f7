"""Shared fixtures of the app tests: a temporary data folder for every test, a chat
database, and (in the widget tests) a fake engine or a tiny real model."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

# As seqmoe_chat.main does, before anything loads PyTorch (it matters when tests/app runs alone).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

from .fakes import FakeBackend  # noqa: E402
from .waits import model_shown  # noqa: E402


@pytest.fixture(scope="package", autouse=True)
def garbage_collected_on_the_gui_thread(qapp):
    """As in the app: a collection on the engine's thread could deadlock with the GUI thread."""
    from seqmoe_chat.application import garbage_collected_on_this_thread

    with garbage_collected_on_this_thread():
        yield


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    """What a test's model change froze (``long_lived``) is garbage to the next test: unfrozen,
    so that collections find it."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data folder; the user's real one is never touched."""
    folder = tmp_path / "data"
    monkeypatch.setenv("SEQMOE_CHAT_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def make_window(qtbot, backend, data_dir: Path):
    """Open the main window on ``data_dir`` with the fake engine, as the app would, and wait
    for its model; call again to "restart" on the same folder."""
    from seqmoe_chat.application import open_context
    from seqmoe_chat.main_window import MainWindow

    def make(wait_for_model: bool = True, model: str | None = None, on_built: Callable[[MainWindow], None] | None = None) -> MainWindow:
        context = open_context(data_dir, backend.open)
        window = MainWindow(context, model)
        qtbot.addWidget(window)
        if on_built is not None:  # the window as built, before the platform shows it
            on_built(window)
        window.show()
        window.activateWindow()
        qtbot.waitUntil(window.isActiveWindow)
        window.start()
        if wait_for_model:
            qtbot.waitUntil(lambda: model_shown(window), timeout=10_000)
        return window

    return make


@pytest.fixture
def window(make_window):
    return make_window()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-MoE (the demo model's architecture) with a chat template."""
    from tests.core.conftest import FAMILIES, build_model

    return build_model(tmp_path_factory.mktemp("models") / "tiny-qwen3-moe", FAMILIES["qwen3_moe"])
