"""SeqMoE: offloaded Mixture-of-Experts inference with predictive expert prefetching.

The public API: ``load_model`` opens a model, ``Engine`` runs it with a budgeted expert
cache, ``Sampling`` says how to pick tokens, and ``Engine.events`` streams what the cache
does. Errors meant for people derive from ``SeqMoEError``.
"""

import os

# OpenMP workers that spin while idle would starve the threads beside compute (a GUI's) on
# small machines. Only effective before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
