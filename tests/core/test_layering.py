"""The engine never imports Qt: it must run where PySide6 is absent."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import seqmoe

BLOCK_QT = """
import importlib.abc, sys
class BlockQt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('PySide6', 'PyQt5', 'PyQt6', 'shiboken6', 'pyqtgraph'):
            raise ImportError('Qt is blocked in this test: ' + name)
sys.meta_path.insert(0, BlockQt())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_every_engine_module_imports_without_qt() -> None:
    names = ["seqmoe"] + [f"seqmoe.{m.name}" for m in pkgutil.iter_modules(seqmoe.__path__) if m.name != "__main__"]
    result = subprocess.run([sys.executable, "-c", BLOCK_QT, *names], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
