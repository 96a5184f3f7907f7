"""SeqMoE: offloaded Mixture-of-Experts inference with predictive expert prefetching.

The public API: ``load_model`` opens a model, ``Engine`` runs it with a budgeted expert
cache, ``Sampling`` says how to pick tokens, and ``Engine.events`` streams what the cache
does. Errors meant for people derive from ``SeqMoEError``.
"""

import os

# The engine runs a copy thread beside compute; OpenMP workers that spin while idle would
# starve it (and a GUI thread) on small machines. Only effective before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .engine import Engine, GenerationResult, Sampling
from .errors import BudgetTooSmall, ModelRefused, SeqMoEError
from .loader import LoadedModel, load_model
from .stats import GenerationStats

__all__ = [
    "BudgetTooSmall",
    "Engine",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "ModelRefused",
    "Sampling",
    "SeqMoEError",
    "load_model",
]
