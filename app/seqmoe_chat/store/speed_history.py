"""Decode speeds measured by earlier replies, by cache size: what a VRAM budget is likely
to give. Every finished reply stores its statistics (policy, device, link, cache slots,
decode tokens/s), so the chat database already holds these measurements."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from .records import ASSISTANT, DONE

RECENT_REPLIES = 500


@dataclass(frozen=True)
class SpeedEstimate:
    tokens_per_s: float
    basis: str  # how it was found, for people


def measured_speeds(
    connection: sqlite3.Connection, model_id: str, policy: str, device: str,
    link_setup: str | None = None, link_gbps: float | None = None, bytes_per_copy: float | None = None,
) -> dict[int, float]:
    """Decode tokens/s by cache slots for ``model_id`` with ``policy`` on ``device``; the newest reply wins.
    On an emulated link only replies on the same one count: matched to the same setup (whose
    speed follows the machine's), else at the same fixed speed; replies stored before the link
    was recorded do not. Given ``bytes_per_copy``, only replies whose copies moved as many bytes
    count: those from before the experts were packed moved more."""
    rows = connection.execute(
        "SELECT stats FROM messages WHERE role = ? AND state = ? AND model_id = ? ORDER BY id DESC LIMIT ?",
        (ASSISTANT, DONE, model_id, RECENT_REPLIES),
    )
    speeds: dict[int, float] = {}
    for (text,) in rows:
        stats = json.loads(text)
        speed = stats.get("decode_tokens_per_s") or stats.get("tokens_per_s")
        slots = stats.get("cache_slots")
        if (stats.get("policy") == policy and stats.get("device") == device and speed and isinstance(slots, int)
                and _same_link(stats, link_setup, link_gbps)
                and (bytes_per_copy is None or stats.get("bytes_per_copy") == bytes_per_copy)):
            speeds.setdefault(slots, float(speed))
    return speeds


def _same_link(stats: dict, link_setup: str | None, link_gbps: float | None) -> bool:
    if stats.get("link") != "emulated":
        return True
    if link_setup is not None:
        return stats.get("link_setup") == link_setup
    return "link_setup" in stats and stats["link_setup"] is None and stats.get("link_gbps") == link_gbps


def expected_speed(speeds: dict[int, float], slots: int) -> SpeedEstimate | None:
    """The measured speed at ``slots``, else a straight line between the nearest measured
    sizes around it, else the nearest one; None when nothing was measured."""
    if not speeds:
        return None
    if slots in speeds:
        return SpeedEstimate(speeds[slots], f"measured at {slots} slots")
    below = max((s for s in speeds if s < slots), default=None)
    above = min((s for s in speeds if s > slots), default=None)
    if below is not None and above is not None:
        share = (slots - below) / (above - below)
        speed = speeds[below] + share * (speeds[above] - speeds[below])
        return SpeedEstimate(speed, f"between the {below} and {above} slots measured")
    nearest = below if below is not None else above
    assert nearest is not None
    return SpeedEstimate(speeds[nearest], f"measured at {nearest} slots")
