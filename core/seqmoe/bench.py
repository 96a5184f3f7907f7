"""Measured comparison of cache policies on one model, in one run.

Every policy generates the same greedy tokens for the same prompts (offloading never
changes the output; the run checks it), so speeds are comparable; ``full``, every expert
resident, is the reference the others are measured against.

On the emulated link the copy speed is chosen, unless given, so that one expert's
transfer time relative to one MoE layer's decode compute time equals that ratio on a
named consumer setup (``hardware.SETUPS``), the compute time being measured here with ``full``.
A shared machine's speed drifts by tens of percent within a minute while an emulated
copy takes the same time, so every prompt's run is bracketed by two runs of ``full`` on
the same prompt: the one before sets the link, the mean of both is its reference time.
"""

from __future__ import annotations

import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .bound import Access, CopyBound, fewest_copies
from .engine import Engine, Sampling
from .errors import SeqMoEError
from .events import EventBuffer, EventBus, LayerRouted
from .hardware import SETUPS
from .policies import ORACLES
from .stats import GenerationStats, hits_share, late_share
from .user_files import replacing, writing

BUILT_IN_PROMPTS = [
    "Hi! What do you like to do on weekends?",
    "I just adopted a puppy. Any tips for a first-time dog owner?",
    "What is your favorite food, and can you cook it yourself?",
    "I'm thinking about learning to play the guitar. Have you ever played an instrument?",
]


@dataclass
class Totals:
    """Statistics of one policy at one cache ratio, summed over the prompts."""

    runs: list[GenerationStats] = field(default_factory=list)

    def total(self, name: str) -> float:
        return sum(getattr(stats, name) for stats in self.runs)

    @property
    def decode_tokens(self) -> int:
        return int(sum(max(s.tokens - 1, 0) for s in self.runs))

    @property
    def decode_seconds(self) -> float:
        return sum(s.seconds - s.time_to_first_token for s in self.runs if s.tokens > 1)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        tokens = max(self.total("tokens"), 1)
        decode = self.total("decode_hits"), self.total("decode_late"), self.total("decode_misses")
        prefill = self.total("prefill_hits"), self.total("prefill_late"), self.total("prefill_misses")
        issued = self.total("prefetch_issued")
        return {
            "tokens": int(self.total("tokens")),
            "tokens_per_s": self.tokens_per_s,
            "hit_rate": hits_share(*decode, empty=1.0),
            "late_rate": late_share(*decode, empty=0.0),
            "stall_seconds_per_token": self.total("decode_stall_seconds") / max(self.decode_tokens, 1),
            "h2d_bytes_per_token": self.total("h2d_bytes") / tokens,
            "decode_h2d_bytes_per_token": self.total("decode_h2d_bytes") / max(self.decode_tokens, 1),
            "prefill_h2d_bytes": int(self.total("prefill_h2d_bytes")),
            "unused_prefetch_fraction": self.total("prefetch_unused") / issued if issued else 0.0,
            "prefill_tokens_per_s": self.total("prompt_tokens") / max(self.total("time_to_first_token"), 1e-9),
            "prefill_hit_rate": hits_share(*prefill, empty=1.0),
            "prefill_stall_seconds": self.total("prefill_stall_seconds"),
        }


@dataclass
class BenchRow:
    policy: str
    cache_ratio: float
    cache_slots: int
    totals: Totals
    ratio_to_full: float
    same_tokens: bool
    bytes_per_copy: float
    """What one expert's copy moves over the link, on average (packed experts differ only by the
    few weights each keeps whole), to count copies from the bytes."""
    copy_layers: float | None = None
    """One expert copy in layers of ``full``'s decode compute, as run (emulated link)."""

    def as_dict(self) -> dict[str, object]:
        totals = self.totals.as_dict()
        return {
            "policy": self.policy,
            "cache_ratio": self.cache_ratio,
            "cache_slots": self.cache_slots,
            **totals,
            "decode_copies_per_token": totals["decode_h2d_bytes_per_token"] / self.bytes_per_copy,
            "ratio_to_full": self.ratio_to_full,
            "same_tokens_as_full": self.same_tokens,
            "copy_layers": self.copy_layers,
        }


def layer_seconds(totals: Totals, num_layers: int) -> float:
    """One MoE layer's share of a decode step."""
    return 1.0 / totals.tokens_per_s / num_layers


def require_decode(full: Totals) -> None:
    """Refuse runs whose every reply ended at its first token: decode speed is timed from the second."""
    if not full.decode_tokens:
        raise SeqMoEError("no reply went past its first token, so there is no decode to time; give other prompts")


def set_link(engine: Engine, full: Totals, copy_layers: float) -> None:
    """Set the emulated link so that one expert's bytes, as they are in the slot, take ``copy_layers``
    layers of ``full``'s decode: a consumer setup's link, whatever packing then saves of it."""
    require_decode(full)
    copy_seconds = copy_layers * layer_seconds(full, engine.loaded.host.num_layers)
    expert_bytes = engine.loaded.host.layout.bytes_per_expert
    engine.link_gbps = expert_bytes / max(copy_seconds - engine.link_latency_s, 1e-9) / 1e9


def emulated_copy_seconds(engine: Engine) -> float:
    """One expert's copy on the engine's emulated link, as configured (``EmulatedCopier``'s model),
    of the bytes it moves (packed, when the experts are; see ``compression``)."""
    return engine.link_latency_s + engine.loaded.host.bytes_per_copy / (engine.link_gbps * 1e9)


def full_speed(engine: Engine, prompts: list[list[int]], sampling: Sampling) -> Totals:
    engine.configure("full")
    return Totals([engine.generate(p, sampling).stats for p in prompts])


MATCH_PROMPTS = 2
MATCH_TOKENS = 16


def match_link(engine: Engine, setup: str, prompts: list[list[int]] | None = None,
               max_new_tokens: int = MATCH_TOKENS) -> float:
    """Time ``full``'s decode on ``prompts`` (by default the first built-in ones, as user turns)
    after a short warm-up, and set the emulated link so that one expert copy takes as many of
    its MoE layers as on ``setup`` (a name of ``SETUPS``); returns the link's speed in GB/s. The
    engine is left with the ``full`` policy: configure the one wanted next, which builds its
    copier on this link. These runs are nobody's replies: the event stream's listeners do not
    see them. A link that could not be timed (no reply went past its first token) is left as it was."""
    copy_layers = SETUPS[setup].transfer_to_compute
    if engine.link != "emulated":
        raise SeqMoEError(f"only an emulated link can be matched to a setup; this engine copies over {engine.link}")
    if prompts is None:
        chat = engine.loaded.has_chat_template
        prompts = [engine.encode(text, chat=chat) for text in BUILT_IN_PROMPTS[:MATCH_PROMPTS]]
    listened, engine.events = engine.events, EventBus()
    try:
        engine.configure("full")
        engine.generate(prompts[0], Sampling(max_new_tokens=4))  # the first call's one-off setup is no decode
        set_link(engine, full_speed(engine, prompts, Sampling(max_new_tokens=max_new_tokens)), copy_layers)
        engine.link_setup = setup
    finally:
        engine.events = listened
        engine.configure("full")
    return engine.link_gbps


@dataclass
class BenchResult:
    rows: list[BenchRow]
    bounds: list[CopyBound]
    """Per cache ratio, what no policy passes on these prompts (``bound``) when a copy takes the
    setup's ``copy_layers``; none on a real link."""
    cut: list[tuple[int, int]]
    """(prompt number from 1, reply tokens) of each reply the context ended before ``max_new_tokens``:
    the same under every policy, whose tokens are ``full``'s."""


def run_bench(
    engine: Engine,
    prompts: list[list[int]],
    policies: list[str],
    ratios: list[float],
    max_new_tokens: int,
    copy_layers: float | None = None,
) -> BenchResult:
    """Every policy at every cache ratio over the same prompts. Each prompt's run is bracketed
    by two runs of ``full`` on the same prompt, the mean of which is its reference; with
    ``copy_layers`` (emulated link) the run before also sets the link, so that one expert
    copy takes that many layers of ``full``'s decode."""
    greedy = Sampling(max_new_tokens=max_new_tokens)
    layers = engine.loaded.host.num_layers
    bytes_per_copy = engine.loaded.host.bytes_per_copy
    engine.configure("full")
    engine.generate(prompts[0], Sampling(max_new_tokens=4))
    reference = [engine.generate(p, greedy) for p in prompts]
    full = Totals([r.stats for r in reference])
    require_decode(full)
    rows, bounds = [], []
    # One recording per prompt and ratio serves the bound and the oracles; neither, none.
    record = copy_layers is not None or any(policy in ORACLES for policy in policies)
    for ratio in ratios:
        accesses = [record_accesses(engine, p, greedy, ratio) for p in prompts] if record else []
        if copy_layers is not None:
            counts = [fewest_copies(run, engine.cache_slots) for run in accesses]
            copies, tokens = (sum(column) for column in zip(*counts))
            bounds.append(CopyBound.of(ratio, copies, tokens, layers, copy_layers * engine.loaded.host.packed_share))
        futures = [future_of(run) for run in accesses]
        for policy in policies:
            if policy == "full":
                continue
            totals, same, full_seconds, ran = Totals(), True, 0.0, []
            for index, prompt in enumerate(prompts):
                before = full_speed(engine, [prompt], greedy)
                if copy_layers is not None:
                    # A reply that ends at its first token has no decode to time: the link then
                    # follows full's speed over all prompts.
                    set_link(engine, before if before.decode_tokens else full, copy_layers)
                future = futures[index] if policy in ORACLES else None
                engine.configure(policy, cache_ratio=ratio, future=future)
                slots = engine.cache_slots
                result = engine.generate(prompt, greedy)
                totals.runs.append(result.stats)
                same &= result.token_ids == reference[index].token_ids
                bracket = Totals(before.runs + full_speed(engine, [prompt], greedy).runs)
                full.runs.extend(bracket.runs)
                full_seconds += bracket.decode_seconds / 2
                if engine.link == "emulated" and bracket.decode_tokens:
                    ran.append(emulated_copy_seconds(engine) / layer_seconds(bracket, layers))
            speed = totals.decode_tokens / full_seconds if full_seconds > 0 else 0.0
            ratio_to_full = totals.tokens_per_s / speed if speed > 0 else 0.0
            copy_ran = sum(ran) / len(ran) if ran else None
            rows.append(BenchRow(policy, ratio, slots, totals, ratio_to_full, same, bytes_per_copy, copy_ran))
    engine.configure("full")
    rows.insert(0, BenchRow("full", 1.0, engine.cache_slots, full, 1.0, True, bytes_per_copy))
    engine.close()
    cut = [(number, run.stats.tokens) for number, run in enumerate(reference, 1) if run.stats.context_full]
    return BenchResult(rows, bounds, cut)


def event_stream_overhead(
    engine: Engine, prompts: list[list[int]], ratio: float, max_new_tokens: int, rounds: int = 3
) -> dict[str, float]:
    """Decode speed of the ``seqmoe`` policy with nobody listening against a listener that a GUI
    would use (an ``EventBuffer`` drained ten times a second by another thread), alternated
    ``rounds`` times so that drift in the machine's speed hits both alike."""
    greedy = Sampling(max_new_tokens=max_new_tokens)
    engine.configure("seqmoe", cache_ratio=ratio)
    engine.generate(prompts[0], Sampling(max_new_tokens=4))
    plain, listened, events = Totals(), Totals(), 0
    for _ in range(rounds):
        plain.runs.extend(engine.generate(p, greedy).stats for p in prompts)
        buffer, stop = EventBuffer(), threading.Event()
        drained: list[int] = []

        def drain() -> None:
            while not stop.wait(0.1):
                drained.append(len(buffer.drain()))
            drained.append(len(buffer.drain()))

        consumer = threading.Thread(target=drain)
        consumer.start()
        engine.events.subscribe(buffer)
        try:
            listened.runs.extend(engine.generate(p, greedy).stats for p in prompts)
        finally:
            engine.events.unsubscribe(buffer)
            stop.set()
            consumer.join()
        events += sum(drained)
    return {
        "tokens_per_s_without_listener": plain.tokens_per_s,
        "tokens_per_s_with_listener": listened.tokens_per_s,
        "overhead": 1.0 - listened.tokens_per_s / plain.tokens_per_s,
        "events_per_token": events / max(listened.total("tokens"), 1),
    }


def record_accesses(engine: Engine, prompt_ids: list[int], sampling: Sampling, ratio: float) -> list[Access]:
    """Every cache access of the greedy run at this cache size (the accesses, like the tokens, are
    the same under every policy): what the oracles know in advance and MIN is computed on."""
    accesses: list[Access] = []

    def listen(event: object) -> None:
        if isinstance(event, LayerRouted):
            accesses.append(Access(event.layer, event.experts, not event.prefill))

    engine.configure("lru", cache_ratio=ratio)
    engine.events.subscribe(listen)
    try:
        engine.generate(prompt_ids, sampling)
    finally:
        engine.events.unsubscribe(listen)
    return accesses


def future_of(accesses: list[Access]) -> list[tuple[int, frozenset[int]]]:
    """Recorded accesses as the oracle policies take them."""
    return [(a.layer, frozenset(a.experts)) for a in accesses]


def format_table(rows: list[BenchRow]) -> str:
    header = (
        f"{'policy':<12}{'ratio':>7}{'slots':>7}{'tok/s':>9}{'vs full':>9}{'hit rate':>10}{'stall ms/tok':>14}"
        f"{'copies/tok':>12}{'unused pf':>11}{'prefill tok/s':>15}{'copy/layer':>12}  same"
    )
    lines = [header]
    for row in rows:
        d = row.as_dict()
        lines.append(
            f"{d['policy']:<12}{d['cache_ratio']:>7.2f}{d['cache_slots']:>7}{d['tokens_per_s']:>9.2f}"
            f"{d['ratio_to_full']:>9.1%}{d['hit_rate']:>10.1%}{1000 * d['stall_seconds_per_token']:>14.2f}"
            f"{d['decode_copies_per_token']:>12.2f}{d['unused_prefetch_fraction']:>11.1%}"
            f"{d['prefill_tokens_per_s']:>15.1f}{_optional(row.copy_layers):>12}  {'yes' if d['same_tokens_as_full'] else 'NO'}"
        )
    # The full row's tok/s is the mean of all its runs, a row's vs full its own bracketing runs (run_bench).
    lines.append("vs full: each run against the two full runs around it, so it may rank rows otherwise than tok/s")
    return "\n".join(lines)


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def wrapped(title: str, width: int = 110) -> str:
    """``title`` wrapped to ``width`` columns, each of its lines apart (``textwrap.fill`` alone
    would run them together)."""
    return "\n".join(textwrap.fill(line, width) for line in title.splitlines())


PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""Formats matplotlib writes without a backend of its own to install."""


def plot(rows: list[BenchRow], bounds: list[CopyBound], path: Path, title: str) -> None:
    """Throughput relative to ``full`` against cache ratio, one line per policy, and the bound no
    policy passes (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r.policy for r in rows if r.policy != "full"):
        points = sorted((r.cache_ratio, r.ratio_to_full) for r in rows if r.policy == policy)
        axes.plot(*zip(*points), marker="o", label=policy)
    if bounds:
        points = sorted((b.cache_ratio, b.ratio_to_full) for b in bounds)
        axes.plot(*zip(*points), color="black", linestyle=":", marker="x", label="bound (Belady's MIN)")
    axes.axhline(1.0, color="grey", linestyle="--", label="full")
    axes.set_xlabel("cache ratio (experts on the device / all experts)")
    axes.set_ylabel("decode throughput relative to full")
    axes.set_title(wrapped(title), fontsize=8, parse_math=False)  # a path's "$" is no formula
    axes.legend()
    figure.tight_layout()
    with writing(path), replacing(path) as partial:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            figure.savefig(partial, dpi=120, format=path.suffix[1:].lower())
        except ValueError as error:  # what matplotlib cannot draw or encode, in a message of several lines
            raise SeqMoEError(f"cannot write {path}: {' '.join(str(error).split())}") from None
