"""A model's settings layer by layer, for configs whose layers differ.

transformers lets a config override settings per decoder layer (``per_layer_config``:
other head counts, expert counts or widths, skipped sub-layers). Reading such a setting
from the model-wide config raises, so what the engine sizes or checks reads each layer's
own config instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PretrainedConfig

from .counts import is_count


def layer_configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    """The text config of each decoder layer: the same object for every layer unless they differ."""
    text = config.get_text_config()
    layers = getattr(text, "num_hidden_layers", 0) or 0
    if getattr(text, "is_heterogeneous", False):
        return list(text.per_layer_config)
    return [text] * layers


def largest_int(config: PretrainedConfig, keys: Iterable[str]) -> int:
    """The largest positive integer any layer gives under the first of ``keys`` it has (0: none)."""
    keys = tuple(keys)
    largest = 0
    for layer in layer_configs(config) or [config.get_text_config()]:
        for key in keys:
            value = getattr(layer, key, None)
            if is_count(value, 1):
                largest = max(largest, value)
                break
    return largest
