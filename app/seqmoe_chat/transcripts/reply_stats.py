"""The one-line summary of a reply's statistics, as the chat and the exports show it."""

from __future__ import annotations

from typing import Any

# The figures the chat, the status bar and the exports format as numbers: an imported
# transcript must hold numbers there.
NUMBERS = frozenset({
    "tokens", "prompt_tokens", "reused_prompt_tokens", "tokens_per_s", "decode_tokens_per_s", "time_to_first_token",
    "hit_rate", "decode_hit_rate", "hits", "misses", "stall_seconds", "gui_stall_ms",
})


def stats_line(stats: dict[str, Any]) -> str:
    """E.g. "42 tokens · 31.2 tok/s · first token 0.21 s · hit rate 96.9% · stalls 0.03 s", and
    why the reply ended early when the context was full. Speed and hit rate are those of
    generating, after the first token (see ``generating``)."""
    if not stats:
        return ""
    tokens = stats.get("tokens", 0)
    parts = [f"{tokens} token{'' if tokens == 1 else 's'}"]
    speed, hit_rate = generating(stats)
    if speed is not None:
        parts.append(f"{speed:.1f} tok/s")
    if "time_to_first_token" in stats:
        parts.append(f"first token {stats['time_to_first_token']:.2f} s")
    if hit_rate is not None:
        parts.append(f"hit rate {hit_rate:.1%}")
    if "stall_seconds" in stats:
        parts.append(f"stalls {stats['stall_seconds']:.2f} s")
    if stats.get("context_full"):
        parts.append("stopped where the context was full")
    return " · ".join(parts)


def generating(stats: dict[str, Any]) -> tuple[float | None, float | None]:
    """A reply's speed and expert-cache hit rate while it generated, after its first token: the
    time to the first token (reading the prompt, whose layers stream most experts in) is shown
    apart, as chat apps do, and the hit rate while generating is what sets the speed. A reply of
    one token, or statistics stored without the decode figures, give the whole reply's."""
    decoded = stats.get("tokens", 0) > 1
    speed = stats.get("decode_tokens_per_s") if decoded else None
    hit_rate = stats.get("decode_hit_rate") if decoded else None
    return (stats.get("tokens_per_s") if speed is None else speed,
            stats.get("hit_rate") if hit_rate is None else hit_rate)
