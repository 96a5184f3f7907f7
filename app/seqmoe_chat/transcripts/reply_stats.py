"""The one-line summary of a reply's statistics, as the chat and the exports show it."""

from __future__ import annotations

from typing import Any


def stats_line(stats: dict[str, Any]) -> str:
    """E.g. "42 tokens · 31.2 tok/s · first token 0.21 s · hit rate 96.9% · stalls 0.03 s", and
    why the reply ended early when the context was full."""
    if not stats:
        return ""
    parts = [f"{stats.get('tokens', 0)} tokens"]
    if "tokens_per_s" in stats:
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if "time_to_first_token" in stats:
        parts.append(f"first token {stats['time_to_first_token']:.2f} s")
    if "hit_rate" in stats:
        parts.append(f"hit rate {stats['hit_rate']:.1%}")
    if "stall_seconds" in stats:
        parts.append(f"stalls {stats['stall_seconds']:.2f} s")
    if stats.get("context_full"):
        parts.append("stopped where the context was full")
    return " · ".join(parts)
