"""The engine's first import from two threads at once (the worker loading the first model
while the Models window lists the library) gives both threads a whole engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# In a fresh interpreter: in this one, the tests have imported the engine already.
SCRIPT = """
import sys, threading
from pathlib import Path
from seqmoe_chat.models.library import Library
from seqmoe_chat.store import EngineOptions
from seqmoe_chat.worker import open_engine

failures = []

def run(name, call):
    try:
        call()
    except Exception as error:
        failures.append(f"{name}: {type(error).__name__}: {error}")

threads = [
    threading.Thread(target=run, args=("load", lambda: open_engine("", EngineOptions(device="cpu"), lambda *_: None).close())),
    threading.Thread(target=run, args=("library", lambda: Library(Path(sys.argv[1])).items())),
]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


def test_loading_a_model_and_listing_the_library_at_once_both_work(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
