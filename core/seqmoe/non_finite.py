"""Where parsed JSON holds a number that is not finite.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` (and a literal too large for a
float, such as ``1e400``, as infinity), which strict JSON has no words for. A config holding one
may build a model without complaint whose logits are all NaN (an ``rms_norm_eps`` of NaN does):
found here, it is refused by name.
"""

from __future__ import annotations

import json
import math


def first_non_finite(value: object) -> tuple[str, float] | None:
    """The key path (``rope_scaling.factor``, ``layer_types[3]``) and value of the first number in
    ``value``, read in document order, that is not finite; ``None`` when all are."""
    # A stack, not recursion: json reads nesting as deep as the recursion limit, which calling
    # down from here would pass.
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, item
        if isinstance(item, dict):
            stack.extend((_key_path(path, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", item[index]) for index in reversed(range(len(item))))
    return None


def _key_path(path: str, key: str) -> str:
    # A key may hold any text, a line break too: all but plain names are quoted, so the message stays one line.
    name = key if key.isidentifier() else json.dumps(key)
    return f"{path}.{name}" if path else name
