"""Budgets in GiB as people give and read them: the engine takes ``int(gib * 2**30)`` bytes."""

from __future__ import annotations

import math

GIB = 2**30


def gib_rounded_up(size: int, decimals: int) -> float:
    """``size`` bytes in GiB at ``decimals``, rounded up so that the engine, which reads
    ``int(gib * 2**30)`` bytes, gets at least ``size``: a budget of the figure shown buys its slots."""
    scale = 10**decimals
    shown = math.ceil(size * scale / GIB) / scale
    return shown if int(shown * GIB) >= size else shown + 1 / scale
