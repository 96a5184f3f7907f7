"""Whether a folder holds a model the engine can open: the loader's own checks (config,
architecture, weights, tokenizer), without loading the weights."""

from __future__ import annotations

from pathlib import Path

from ..engine_import import import_engine


def check_model_folder(path: Path) -> str:
    """The model's architecture; raises ``seqmoe.ModelRefused`` with the loader's reason."""
    import_engine()
    from seqmoe.loader import check_supported, check_weights, load_tokenizer, read_config

    config = read_config(path)
    skeleton = check_supported(config)
    check_weights(path)
    load_tokenizer(path)
    return type(skeleton).__name__
