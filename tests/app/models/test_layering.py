"""The model manager's logic runs without Qt: the download and calibration processes import
it, and its tests need no display. (PyTorch stays allowed: the checks are the engine's.)"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import seqmoe_chat.models

BLOCK = """
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('PySide6', 'shiboken6'):
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_the_model_managers_logic_needs_no_qt() -> None:
    package = seqmoe_chat.models
    names = [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    result = subprocess.run([sys.executable, "-c", BLOCK, *names], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
