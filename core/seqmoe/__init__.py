"""SeqMoE: offloaded Mixture-of-Experts inference with predictive expert prefetching.

The public API: ``load_model`` opens a model, ``Engine`` runs it with a budgeted expert
cache, ``Sampling`` says how to pick tokens, and ``Engine.events`` streams what the cache
does. Errors meant for people derive from ``SeqMoEError``.
"""

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
