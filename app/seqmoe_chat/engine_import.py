"""The engine, PyTorch and transformers imported once, on whichever thread needs them first.

The app imports them off the GUI thread: the engine worker as it loads the first model, and
at the same moment the Models window's background jobs (the library's predictor states, the
catalog's fits, a hub or folder check). Two threads importing them for the first time at
once take Python's per-module import locks in opposite orders (the engine's modules and
transformers' lazily imported ones); Python breaks that deadlock by handing one thread a
half-initialised module, which fails as "cannot import name 'DynamicCache' from
'transformers'". So every such path calls ``import_engine`` first, while it holds no import
lock (from a function, never at a module's top level); after the first call it costs a lock.

While that first import runs, ``sys.modules`` already holds its half-initialised modules (a
``torch`` without ``torch.cuda``): code that only asks about them, never importing them itself,
asks ``engine_imported`` first.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_imported = False


def import_engine() -> None:
    global _imported
    with _lock:
        import seqmoe.engine  # noqa: F401 - imports PyTorch and transformers, and the predictor

        _imported = True


def engine_imported() -> bool:
    """Whether ``import_engine`` has finished: from then on PyTorch and the engine are whole."""
    return _imported
