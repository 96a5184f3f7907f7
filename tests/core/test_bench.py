"""``seqmoe bench``: the same prompts for every policy, identical tokens, the documented figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqmoe.cli import main

ROW_KEYS = {
    "policy", "cache_ratio", "cache_slots", "tokens_per_s", "ratio_to_full", "hit_rate", "stall_seconds_per_token",
    "h2d_bytes_per_token", "unused_prefetch_fraction", "prefill_tokens_per_s", "prefill_hit_rate",
    "prefill_stall_seconds", "same_tokens_as_full",
}


def test_bench_reports_every_policy_and_ratio_with_identical_tokens(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n\nhow are you today?\n", encoding="utf-8")
    status = main([
        "bench", "--model", str(mixtral_dir), "--device", "cpu", "--prompts", str(prompts), "--policies", "lru,seqmoe,oracle,oracle-next",
        "--cache-ratios", "0.5", "--max-new-tokens", "4", "--json", "--event-overhead",
    ])
    out, err = capsys.readouterr()
    assert status == 0
    report = json.loads(out)
    rows = report["rows"]
    assert [(r["policy"], r["cache_ratio"]) for r in rows] == [
        ("full", 1.0), ("lru", 0.5), ("seqmoe", 0.5), ("oracle", 0.5), ("oracle-next", 0.5)
    ]
    for row in rows:
        assert ROW_KEYS <= set(row) and row["same_tokens_as_full"]
    # The same prompts for every policy; full ran them before and after every row too.
    assert len({row["tokens"] for row in rows[1:]}) == 1 and rows[0]["tokens"] == 9 * rows[1]["tokens"]
    assert "one expert copy =" in report["link"] and "before every run" in report["link"]
    # Each run's link was set from full's speed just before it: a copy takes about the setup's 3.94 layers.
    assert all(row["copy_layers"] > 1.0 for row in rows[1:]) and rows[0]["copy_layers"] is None
    assert all(row["cache_slots"] < rows[0]["cache_slots"] for row in rows[1:])  # the policy's cache, not full's
    stream = report["event_stream"]
    assert stream["events_per_token"] > 0 and stream["tokens_per_s_with_listener"] > 0
    assert "event stream:" in err and "oracle" in err
