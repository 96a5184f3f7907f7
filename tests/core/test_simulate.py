"""The trace-driven simulator agrees with the emulated runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import seqmoe.simulate
from seqmoe import Engine, Sampling, load_model
from seqmoe.cli import main
from seqmoe.policies import Policy
from seqmoe.bound import Access, fewest_copies
from seqmoe.hardware import HARDWARE, SHAPES
from seqmoe.simulate import SimulatedCopier, VirtualClock, copy_bound, simulate
from seqmoe.transfer import CopyJob
from seqmoe.trace import Document, RoutingRecorder, Traces, trace_document

from .conftest import CHAT_TEXT, FAMILIES, build_model

PROMPT = [5, 17, 42, 99, 23, 64, 7, 88, 31, 12, 56, 77]
NEW_TOKENS = 16


def _run_and_trace(model: Path, ratio: float) -> tuple[object, Traces]:
    engine = Engine(load_model(str(model), device="cpu"))
    engine.configure("lru", cache_ratio=ratio)
    stats = engine.generate(PROMPT, Sampling(max_new_tokens=NEW_TOKENS)).stats
    # generate runs one forward pass per new token but the last; the trace records the same passes.
    recorder = RoutingRecorder(engine.loaded)
    record = trace_document(engine.loaded, recorder, Document(PROMPT, continuation=stats.tokens - 1))
    recorder.close()
    engine.close()
    record["document"] = record["decode"].int() * 0
    return stats, Traces(manifest={}, **record)


@pytest.mark.parametrize("ratio", [0.35, 0.6])
def test_simulator_and_emulated_runtime_agree_on_lru_hit_rate(tiny_models: dict[str, Path], ratio: float) -> None:
    stats, traces = _run_and_trace(tiny_models["olmoe"], ratio)
    result = simulate(traces, "lru", ratio, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    assert result.decode_tokens == stats.tokens - 1
    assert (result.hits, result.misses) == (stats.decode_hits, stats.decode_misses)
    assert result.hits > 0 and result.misses > 0


def test_the_simulated_oracle_knows_the_whole_replay_prefill_included(tiny_models: dict[str, Path]) -> None:
    _, traces = _run_and_trace(tiny_models["olmoe"], 0.35)
    lru = simulate(traces, "lru", 0.35, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    oracle = simulate(traces, "oracle", 0.35, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    # Misaligned with prefill, the oracle "knew" the wrong future and missed almost as often as LRU.
    assert oracle.misses < lru.misses / 2


def test_prefill_shows_the_policy_the_prompts_last_token_in_engine_and_simulator_alike(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[tuple[int, list[int], torch.Tensor]] = []

    def record(self: Policy, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> None:
        told.append((layer, sorted(routed.tolist()), hidden.to(torch.float16)))  # as traces store it

    monkeypatch.setattr(Policy, "look_past_prompt", record)
    _, traces = _run_and_trace(tiny_models["olmoe"], 0.6)
    layers = traces.experts.shape[1]
    # generate's one prefill pass (then the trace's own, through the same engine): every MoE
    # layer in order, each with the prompt's last token.
    assert [layer for layer, _, _ in told] == list(range(layers)) * 2
    by_engine = told[:layers]
    told.clear()
    simulate(traces, "lru", 0.6, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    assert [routed for _, routed, _ in by_engine] == [sorted(traces.experts[len(PROMPT) - 1, layer].tolist()) for layer in range(layers)]
    assert [(layer, routed) for layer, routed, _ in told] == [(layer, routed) for layer, routed, _ in by_engine]
    assert all(torch.equal(a, b) for (_, _, a), (_, _, b) in zip(told, by_engine))


def test_simulate_command_reports_every_policy_and_ratio(traced: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out = traced
    status = main(["simulate", "--traces", str(out), "--policies", "lru,oracle", "--cache-ratios", "0.4,0.8",
                   "--profile", "rtx4060laptop-pcie4x8", "--shape", "qwen3-30b-a3b", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and (report["profile"], report["shape"]) == ("rtx4060laptop-pcie4x8", "qwen3-30b-a3b")
    rows = {(row["policy"], row["cache_ratio"]): row for row in report["rows"]}
    assert set(rows) == {("lru", 0.4), ("oracle", 0.4), ("lru", 0.8), ("oracle", 0.8)}
    for ratio in (0.4, 0.8):
        lru, oracle = rows["lru", ratio], rows["oracle", ratio]
        assert lru["tokens"] == oracle["tokens"] > 0
        assert 0 < lru["ratio_to_full"] <= oracle["ratio_to_full"] + 1e-9 and oracle["ratio_to_full"] <= 1 + 1e-9
        assert lru["hit_rate"] <= oracle["hit_rate"]
        assert all(0 < row["prefill_ratio_to_full"] <= 1 + 1e-9 for row in (lru, oracle))
    assert rows["lru", 0.4]["hit_rate"] <= rows["lru", 0.8]["hit_rate"]
    bounds = {bound["cache_ratio"]: bound for bound in report["bounds"]}
    assert bounds[0.4]["copy_bound_ratio_to_full"] >= rows["oracle", 0.4]["ratio_to_full"] - 1e-9
    assert bounds[0.4]["min_copies_per_token"] >= bounds[0.8]["min_copies_per_token"]
    # No policy copies fewer experts than Belady's MIN allows.
    assert all(rows[policy, 0.4]["decode_copies_per_token"] >= bounds[0.4]["min_copies_per_token"] - 1e-9
               for policy in ("lru", "oracle"))


def test_simulated_gate_loads_the_traced_routers_guesses(traced: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    model, out = traced
    status = main(["simulate", "--traces", str(out), "--policies", "lru,gate", "--cache-ratios", "0.5",
                   "--model", str(model), "--json"])
    rows = {row["policy"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert status == 0 and rows["gate"]["tokens"] == rows["lru"]["tokens"] > 0
    # Every guess is loaded: some are used, the wrong ones not (on random weights, many: the
    # engine's bench of this model gives gate a lower hit rate than lru, too).
    assert 0 < rows["gate"]["unused_prefetch_fraction"] < 1
    assert rows["gate"]["h2d_bytes_per_token"] > rows["lru"]["h2d_bytes_per_token"]


def test_simulated_seqmoe_without_a_predictor_replays_the_engines_router_fallback(
    traced: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = traced
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no calibrated predictor for the tiny model
    status = main(["simulate", "--traces", str(out), "--policies", "gate,seqmoe", "--cache-ratios", "0.5",
                   "--model", str(model), "--json"])
    captured = capsys.readouterr()
    rows = {row["policy"]: row for row in json.loads(captured.out)["rows"]}
    assert status == 0 and "seqmoe is replayed as the engine runs it until one is calibrated" in captured.err
    # It loads the router's guesses, the next layer's top-k, as gate does (it used to be refused); some go unused.
    assert rows["seqmoe"]["tokens"] == rows["gate"]["tokens"] > 0
    assert 0 < rows["seqmoe"]["unused_prefetch_fraction"] < 1

def test_simulated_gate_refuses_routers_of_another_model(
    traced: tuple[Path, Path], mixtral_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = traced
    status = main(["simulate", "--traces", str(out), "--policies", "gate", "--model", str(mixtral_dir)])
    err = capsys.readouterr().err
    assert status == 2 and f"not of {mixtral_dir.name}: give the traced model with --model" in err


@pytest.mark.parametrize(("flags", "message"), [(["--cache-ratios", "0,0.5"], "above 0 and at most 1"),
                                                (["--profile", "rtx3090"], "unknown profile 'rtx3090'"),
                                                (["--shape", "llama"], "unknown shape 'llama'"),
                                                (["--packed-share", "1.5"], "--packed-share is the share"),
                                                (["--policies", ","], "--policies names no policy (','); choose from lru"),
                                                (["--policies", "lru,full"], "unknown policy 'full'; choose from lru, gate")])
def test_simulate_command_refuses_bad_flags(traced: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                            flags: list[str], message: str) -> None:
    status = main(["simulate", "--traces", str(traced[1]), "--policies", "lru", *flags])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.splitlines()) == 1, err


def test_simulate_refuses_an_unknown_policy_before_reading_the_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["simulate", "--traces", str(tmp_path / "nowhere"), "--policies", "lru,belady"])
    assert status == 2 and "unknown policy 'belady'" in capsys.readouterr().err


def test_simulate_refuses_a_ratio_below_the_minimum_cache_before_any_replay(
    traced: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.simulate, "replay_steps", lambda *args: pytest.fail("a replay ran"))
    status = main(["simulate", "--traces", str(traced[1]), "--policies", "lru", "--cache-ratios", "0.5,0.01"])
    # 3 layers of 8 experts, top-4: as generate says it for a cache of that model.
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: cache ratio 0.01 leaves 0 expert slots, below this model's minimum of 5 (top-k 4 + 1): "
        "it needs a cache ratio of at least 0.19\n")


def test_simulate_runs_a_policy_and_ratio_given_twice_once(traced: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["simulate", "--traces", str(traced[1]), "--policies", "lru,lru", "--cache-ratios", "0.5,0.5", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and [(row["policy"], row["cache_ratio"]) for row in report["rows"]] == [("lru", 0.5)]
    assert len(report["bounds"]) == 1


def _decode_only(sequence: list[int], experts: int) -> Traces:
    """One document of decode tokens, one MoE layer, each token using one expert."""
    tokens = len(sequence)
    return Traces({"model": {}}, torch.zeros(tokens, 1, 4).half(), torch.tensor(sequence, dtype=torch.int16).view(-1, 1, 1),
                  torch.zeros(tokens, 1, experts), torch.zeros(tokens, dtype=torch.int32), torch.ones(tokens, dtype=torch.uint8))


def test_the_copy_bound_is_beladys_min() -> None:
    # Two slots, A B C cycling: the first two fill the cache free, then MIN misses every second
    # access (C, B, A, C: four); LRU misses all nine.
    traces = _decode_only([0, 1, 2] * 3, experts=3)
    hardware, shape = HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"]
    bound = copy_bound(traces, 0.67, hardware, shape)
    assert bound.copies_per_token == pytest.approx(4 / 9)
    copy = hardware.link_latency_s + shape.expert_bytes / hardware.link_bytes_per_s
    assert bound.ratio_to_full == pytest.approx(shape.layer_bytes / hardware.memory_bytes_per_s / (4 / 9 * copy))
    assert simulate(traces, "lru", 0.67, hardware, shape).h2d_bytes == 9 * shape.expert_bytes


def test_packed_copies_take_their_share_of_the_link_and_nothing_of_compute() -> None:
    traces = _decode_only([0, 1, 2] * 3, experts=3)
    hardware, raw = HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"]
    packed = raw.packed(0.75)
    assert packed.layer_bytes == raw.layer_bytes and packed.copy_bytes == round(0.75 * raw.expert_bytes)
    slow, fast = (simulate(traces, "lru", 0.67, hardware, shape) for shape in (raw, packed))
    assert (fast.hits, fast.misses, fast.full_seconds) == (slow.hits, slow.misses, slow.full_seconds)
    assert fast.h2d_bytes == 9 * packed.copy_bytes and fast.seconds < slow.seconds
    assert copy_bound(traces, 0.67, hardware, packed).ratio_to_full > copy_bound(traces, 0.67, hardware, raw).ratio_to_full


def test_a_copy_moves_at_least_a_byte_however_well_experts_pack() -> None:
    traces = _decode_only([0, 1, 2] * 3, experts=3)
    tiny = SHAPES["olmoe"].packed(1e-9)
    assert tiny.copy_bytes == 1
    assert simulate(traces, "oracle", 0.67, HARDWARE["rtx4090-pcie4"], tiny).h2d_bytes > 0


def test_a_decode_token_that_names_an_expert_twice_uses_it_once() -> None:
    """As the engine does (``torch.unique`` of the routing): a hand-made trace may repeat one."""
    traces = _decode_only([0, 1, 2, 0], experts=4)
    traces.experts = traces.experts.repeat(1, 1, 2)  # top-2, the same expert twice
    result = simulate(traces, "lru", 0.75, HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"])
    assert (result.hits, result.late + result.misses) == (1, 3)


@pytest.mark.parametrize("policy", ["lru", "oracle"])
def test_no_policy_copies_fewer_experts_than_the_bound(policy: str) -> None:
    generator = torch.Generator().manual_seed(3)
    traces = _decode_only(torch.randint(0, 12, (300,), generator=generator).tolist(), experts=12)
    hardware, shape = HARDWARE["rtx4090-pcie4"], SHAPES["olmoe"]
    for ratio in (0.25, 0.5):
        result = simulate(traces, policy, ratio, hardware, shape)
        bound = copy_bound(traces, ratio, hardware, shape)
        assert result.h2d_bytes / shape.expert_bytes / result.decode_tokens >= bound.copies_per_token - 1e-9
        assert result.as_dict()["ratio_to_full"] <= bound.ratio_to_full + 1e-9


def test_each_reply_starts_the_bound_afresh_and_prefill_costs_nothing() -> None:
    reply = [Access(0, (e,), True) for e in (0, 1, 2, 0, 1, 2)]
    prompt = [Access(0, (3, 4), False)]
    # Two slots, per reply: 0 and 1 load free, then 2 (evicting 1, used after 0) and 1 (evicting 0,
    # not used again): 2 copies. The prompt between two replies counts nothing.
    assert fewest_copies(reply, 2) == (2, 6)
    assert fewest_copies(reply + prompt + reply, 2) == (4, 12)


def test_a_simulated_copy_queued_behind_another_starts_when_the_lane_comes_free() -> None:
    clock = VirtualClock()
    copier = SimulatedCopier(clock, seconds_per_copy=1.0, expert_bytes=1)
    jobs = [CopyJob((0, expert), expert, None, 1) for expert in range(3)]
    for job in jobs:
        copier.submit(job)
    clock.now = 2.5  # one layer of compute, longer than two copies; nothing looked at the lane meanwhile
    assert [copier.done(job) for job in jobs] == [True, True, False]
    copier.wait(jobs[2])
    assert clock.now == 3.0 and copier.stall_seconds() == pytest.approx(0.5)


def test_traces_without_decode_tokens_are_refused_not_reported_as_fast_as_full(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "chat.txt"
    text.write_text(CHAT_TEXT)
    out = tmp_path / "tr0"
    assert main(["trace", "--model", str(traced[0]), "--device", "cpu", "--text", str(text), "--continuation", "0",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    status = main(["simulate", "--traces", str(out), "--policies", "lru,oracle", "--cache-ratios", "0.5"])
    out_text, err = capsys.readouterr()
    assert status == 2 and out_text == "" and err == (
        "seqmoe: error: the traces hold no decode tokens (traced with --continuation 0): the simulator replays "
        "decoding; trace with --continuation 1 or more\n")


@pytest.mark.parametrize(("flag", "message"), [("--compute-efficiency", "--compute-efficiency is a share"),
                                               ("--packed-share", "--packed-share is the share")])
def test_simulate_refuses_a_bad_share_before_reading_the_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    status = main(["simulate", "--traces", str(tmp_path / "nowhere"), "--policies", "lru", flag, "0"])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.splitlines()) == 1, err


def test_simulated_gate_tells_another_model_of_the_same_name_apart(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = traced
    other = build_model(tmp_path / model.name, FAMILIES[model.name], seed=1)  # same folder name, other weights
    status = main(["simulate", "--traces", str(out), "--policies", "gate", "--cache-ratios", "0.5", "--model", str(other)])
    assert status == 2 and capsys.readouterr().err == (
        f"seqmoe: error: the traces are of another model named {model.name}: the config or router weights of "
        f"{other} differ from the traced model's; give the traced model with --model\n")
