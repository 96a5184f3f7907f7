"""What a config, a flag or a stored file must hold to count something."""

from __future__ import annotations


def is_count(value: object, least: int | None = None) -> bool:
    """A whole number (not a ``bool``, which Python takes for an int), at least ``least`` if given."""
    return isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)
