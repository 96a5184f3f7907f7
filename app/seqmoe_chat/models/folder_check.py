"""Whether a folder holds a model the engine can open: the loader's own checks (config,
architecture, weight files and their sizes, tokenizer), without loading the weights."""

from __future__ import annotations

from pathlib import Path

from ..engine_import import import_engine


def check_model_folder(path: Path) -> str:
    """The model's architecture; raises ``seqmoe.ModelRefused`` with the loader's reason."""
    import_engine()
    from seqmoe.loader import check_model

    return type(check_model(path).skeleton).__name__
