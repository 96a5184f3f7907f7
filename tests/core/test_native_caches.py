"""PyTorch's native kernel caches stay small however many prompt lengths a chat brings."""

from __future__ import annotations

import os
import subprocess
import sys

# A fresh interpreter: the caches' sizes are read at the first matrix product, and this one has made many.
PROMPTS_OF_NEW_LENGTHS = """
import psutil
from seqmoe import Engine, Sampling, load_model
from seqmoe.resources import demo_model_dir

engine = Engine(load_model(str(demo_model_dir()), device="cpu"))
engine.configure("full")
words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing " * 10).split()

def prompts(lengths):
    for length in lengths:
        engine.generate(engine.encode(" ".join(words[:length]), chat=False), Sampling(max_new_tokens=2))

prompts(range(4, 12))  # the shapes every prompt shares
before = psutil.Process().memory_info().rss
prompts(range(12, 132))
print((psutil.Process().memory_info().rss - before) / 2**20)
"""


def test_prompts_of_120_new_lengths_leave_the_engine_within_150_mib() -> None:
    """The demo model is bfloat16, whose CPU products oneDNN compiles per shape and caches: uncapped,
    these prompts added about 440 MiB (up to about 500 MiB in all)."""
    env = {key: value for key, value in os.environ.items() if key not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    result = subprocess.run([sys.executable, "-c", PROMPTS_OF_NEW_LENGTHS], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    grown_mib = float(result.stdout.split()[-1])
    assert grown_mib < 150
