"""The model manager's logic runs without Qt: the download and calibration processes import
it, and its tests need no display. (PyTorch stays allowed: the checks are the engine's.)"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import seqmoe_chat.models
from tests.core.test_layering import BLOCK_QT


def test_the_model_managers_logic_needs_no_qt() -> None:
    package = seqmoe_chat.models
    names = [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    result = subprocess.run([sys.executable, "-c", BLOCK_QT, *names], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
