"""The persistence and export code, and the headless commands, run without Qt and
without the engine (so `seqmoe-chat export` starts in a blink and needs no GPU stack)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import seqmoe_chat.store
import seqmoe_chat.transcripts

BLOCK = """
import importlib, importlib.abc, sys
BLOCKED = ('PySide6', 'shiboken6', 'torch', 'transformers', 'seqmoe')
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_store_transcripts_and_cli_need_neither_qt_nor_the_engine() -> None:
    names = ["seqmoe_chat.cli", "seqmoe_chat.paths", "seqmoe_chat.desktop_entry"]
    for package in (seqmoe_chat.store, seqmoe_chat.transcripts):
        names += [package.__name__] + [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    result = subprocess.run([sys.executable, "-c", BLOCK, *names], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
