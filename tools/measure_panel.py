"""What the live panel costs: the app with the demo model generates the same greedy replies
with the panel visible and hidden, alternately, and prints per mode the GUI thread's CPU
time (in the panel's refreshes, and in all) as a share of one core, and the tokens/s.

    xvfb-run -a .venv/bin/python tools/measure_panel.py --tokens 150 --rounds 2 \
        --screenshot build/notes/panel.png

The demo model's replies are short, so one run sends several prompts, each in a new
conversation, until ``--tokens`` tokens were generated. ``--screenshot`` saves a grab of
the window (and one of the whole panel) during the first reply with the panel visible.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402

from seqmoe_chat.application import create_application, open_context  # noqa: E402
from seqmoe_chat.main_window import MainWindow  # noqa: E402
from seqmoe_chat.store import SamplingSettings  # noqa: E402
from seqmoe_chat.store.settings import DEFAULT_PANEL_HZ  # noqa: E402

PROMPTS = (
    "Hello! What do you like to do on weekends?",
    "Tell me everything about your favourite city.",
    "Can you explain how a computer works, step by step, in detail?",
    "List ten things you would take on a trip and why.",
    "What did you have for dinner yesterday?",
    "Do you have any pets?",
)


@dataclass
class Run:
    panel: str
    tokens: int = 0
    generation_s: float = 0.0  # the engine's own time for the replies
    wall_s: float = 0.0
    gui_cpu_s: float = 0.0
    refresh_cpu_s: float = 0.0
    refreshes: int = 0
    events: int = 0

    def line(self) -> str:
        return (f"panel {self.panel:<7} {self.tokens:4d} tokens  {self.tokens / self.generation_s:6.2f} tok/s  "
                f"GUI thread {self.gui_cpu_s / self.wall_s:6.1%} of a core  "
                f"refresh {self.refresh_cpu_s / self.wall_s:6.2%} of a core "
                f"({self.refreshes} refreshes, {self.events} events)")


def wait_until(condition, timeout_s: float = 600.0, during=None) -> None:
    deadline = time.monotonic() + timeout_s
    loop = QEventLoop()
    timer = QTimer()

    def check() -> None:
        if during is not None:
            during()
        if condition() or time.monotonic() > deadline:
            loop.quit()

    timer.timeout.connect(check)
    timer.start(20)
    loop.exec()
    timer.stop()


def generate(window: MainWindow, visible: bool, tokens: int, screenshot: Path | None) -> Run:
    window.panel.setVisible(visible)
    run = Run("visible" if visible else "hidden")
    cost = window.panel.cost
    refresh_before, refreshes_before, events_before = cost.cpu_seconds, cost.refreshes, cost.events
    wall_start, cpu_start = time.perf_counter(), time.thread_time()
    prompts = iter(PROMPTS * 100)
    while run.tokens < tokens:
        window.new_conversation()
        window.composer.set_text(next(prompts))
        window.composer.submit()
        generation = window.panel.model.generations if window.panel.model is not None else 0

        def grab() -> None:
            nonlocal screenshot
            model = window.panel.model
            if screenshot is not None and model is not None and model.generations > generation \
                    and model.counters.tokens >= 10:
                window.grab().save(str(screenshot))
                # The dock scrolls; its whole content goes beside the window's picture.
                whole = screenshot.with_name(f"{screenshot.stem}-dock{screenshot.suffix}")
                window.panel.widget().widget().grab().save(str(whole))
                print(f"screenshot: {screenshot} and {whole}", flush=True)
                screenshot = None

        wait_until(lambda: not window.session.busy, during=grab)
        stats = window.store.thread(window.session.conversation_id)[-1].message.stats
        run.tokens += stats["tokens"]
        run.generation_s += stats["seconds"]
    run.wall_s = time.perf_counter() - wall_start
    run.gui_cpu_s = time.thread_time() - cpu_start
    run.refresh_cpu_s = cost.cpu_seconds - refresh_before
    run.refreshes, run.events = cost.refreshes - refreshes_before, cost.events - events_before
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150, help="tokens per run (default 150)")
    parser.add_argument("--rounds", type=int, default=2, help="visible/hidden pairs (default 2)")
    parser.add_argument("--policy", default="seqmoe")
    parser.add_argument("--cache-ratio", type=float, default=0.3)
    parser.add_argument("--vram-budget", type=float, help="GB; instead of --cache-ratio")
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--hz", type=int, default=DEFAULT_PANEL_HZ, help="panel refreshes per second")
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    create_application()
    with tempfile.TemporaryDirectory(prefix="seqmoe-panel-cost-") as folder:
        context = open_context(Path(folder))
        settings = context.settings
        settings.sampling = SamplingSettings(temperature=0.0, max_new_tokens=args.tokens)
        settings.engine.policy, settings.engine.cache_ratio = args.policy, args.cache_ratio
        settings.engine.vram_budget_gb, settings.engine.link_gbps = args.vram_budget, args.link_gbps
        settings.panel_hz = args.hz
        window = MainWindow(context)
        window.resize(1500, 940)
        window.show()
        window.start()
        wait_until(lambda: context.client.model is not None)
        info = context.client.model
        print(f"{info.name} on {info.device}, policy {info.policy}, {info.cache_slots}/{info.total_experts} slots, "
              f"link {info.link_gbps} GB/s, panel refresh every {window.panel.timer.interval()} ms", flush=True)
        generate(window, True, 8, None)  # warm-up: first-use costs of both paths are not the panel's
        runs = []
        for round_index in range(args.rounds):
            for visible in (True, False):
                shot = args.screenshot if round_index == 0 and visible else None
                runs.append(generate(window, visible, args.tokens, shot))
                print(runs[-1].line(), flush=True)
        for mode in ("visible", "hidden"):
            mine = [r for r in runs if r.panel == mode]
            total = Run(mode, sum(r.tokens for r in mine), sum(r.generation_s for r in mine),
                        sum(r.wall_s for r in mine), sum(r.gui_cpu_s for r in mine),
                        sum(r.refresh_cpu_s for r in mine), sum(r.refreshes for r in mine), sum(r.events for r in mine))
            print("all:", total.line(), flush=True)
        window.close()
        context.database.connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
