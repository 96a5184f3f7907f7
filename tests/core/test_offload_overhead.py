"""The offloaded path's cost tool (tools/offload_overhead.py) that scripts/gpu-check runs, on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "offload_overhead.py"


def test_it_compares_lru_with_every_expert_cached_against_full(tiny_models: dict[str, Path]) -> None:
    result = subprocess.run(
        [sys.executable, str(TOOL), "--model", str(tiny_models["mixtral"]), "--rounds", "1", "--tokens", "6"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    line = re.fullmatch(r"round 1: full ([\d.]+) tok/s, lru with every expert cached ([\d.]+) tok/s \((\d+)% of full\)\n",
                        result.stdout)
    assert line is not None, result.stdout
    full, cached, share = float(line[1]), float(line[2]), int(line[3])
    assert full > 0 and cached > 0 and abs(share - 100 * cached / full) <= 1  # from the rounded speeds printed
