"""End to end: a model downloaded from the (stand-in) hub opens in the app's engine path and
chats; the command line generates with it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seqmoe_chat.models.download_queue import DONE
from seqmoe_chat.models.download_runner import DownloadRunner
from seqmoe_chat.store import EngineOptions
from seqmoe_chat.worker import open_engine

from .conftest import TINY


def test_a_downloaded_model_loads_in_the_app_and_generates(hub, data_dir: Path) -> None:
    runner = DownloadRunner(data_dir)
    entry = runner.enqueue(TINY)
    deadline = time.monotonic() + 120
    while entry.state != DONE:
        assert time.monotonic() < deadline and entry.state != "failed", entry.message
        runner.poll()
        time.sleep(0.05)
    stages: list[str] = []
    engine = open_engine(entry.path, EngineOptions(device="cpu", policy="lru", cache_ratio=0.5),
                         lambda stage, fraction: stages.append(stage))
    try:
        from seqmoe import Sampling

        prompt = engine.encode_messages([{"role": "user", "content": "Hello there!"}])
        result = engine.generate(prompt, Sampling(max_new_tokens=8))
    finally:
        engine.close()
    assert stages[-1] == "Ready" and engine.loaded.architecture == "Qwen3MoeForCausalLM"
    assert len(result.token_ids) > 0 and result.stats.cache_slots < result.stats.total_experts
    command = [sys.executable, "-m", "seqmoe", "generate", "--model", entry.path, "--prompt", "Hi", "--chat",
               "--max-new-tokens", "4", "--cache-ratio", "0.5", "--device", "cpu", "--json"]
    cli = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert cli.returncode == 0, cli.stderr
    stats = json.loads(cli.stdout)["stats"]
    assert stats["tokens"] > 0 and stats["cache_ratio"] == 0.5
