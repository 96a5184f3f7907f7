"""SeqMoE: offloaded Mixture-of-Experts inference with predictive expert prefetching.

The public API: ``load_model`` opens a model, ``Engine`` runs it with a budgeted expert
cache, ``Sampling`` says how to pick tokens, and ``Engine.events`` streams what the cache
does. Errors meant for people derive from ``SeqMoEError``.
"""

import os

# OpenMP workers that spin while idle would starve the threads beside compute (a GUI's) on
# small machines. Only effective before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# On the CPU, bfloat16 matrix products go through oneDNN, which with ideep keeps a compiled kernel
# per shape, up to 1024 of each (about 0.27 MiB apiece). A chat gives new shapes at almost every
# reply (the part of the prompt not in the kept context, each expert's share of its rows), so the
# app's memory grew 1.2 MiB a reply until it settled about 500 MiB higher; capped at 128, about
# 80 MiB. At 64 the bench's `full` decoded 10% slower, likely as a prefill's new shapes pushed out
# the decode steps' (see the README). Read at the first matrix product.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128")
os.environ.setdefault("LRU_CACHE_CAPACITY", "128")

import importlib
from typing import TYPE_CHECKING

from .errors import BudgetTooSmall, ModelCodeFailed, ModelRefused, SeqMoEError

if TYPE_CHECKING:
    from .engine import Engine, GenerationResult, Sampling
    from .loader import LoadedModel, load_model
    from .stats import GenerationStats

# The engine pulls in PyTorch and transformers (seconds); light parts such as
# ``seqmoe.resources`` must not pay for that, so the heavy names load on first use.
_LAZY = {
    "Engine": "engine",
    "GenerationResult": "engine",
    "Sampling": "engine",
    "LoadedModel": "loader",
    "load_model": "loader",
    "GenerationStats": "stats",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)


__all__ = [
    "BudgetTooSmall",
    "Engine",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "ModelCodeFailed",
    "ModelRefused",
    "Sampling",
    "SeqMoEError",
    "load_model",
]
