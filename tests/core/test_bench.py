"""``seqmoe bench``: the same prompts for every policy, identical tokens, the documented figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

import seqmoe.bench
import seqmoe.cli
from seqmoe import Engine, Sampling, load_model
from seqmoe.bench import emulated_copy_seconds, full_speed, layer_seconds, match_link, plot, run_bench, wrapped
from seqmoe.cli import build_parser, main, read_prompts
from seqmoe.errors import SeqMoEError
from seqmoe.hardware import DEFAULT_SETUP

from .conftest import without_chat_template
from .test_equivalence import PROMPT

ROW_KEYS = {
    "policy", "cache_ratio", "cache_slots", "tokens_per_s", "ratio_to_full", "hit_rate", "stall_seconds_per_token",
    "h2d_bytes_per_token", "unused_prefetch_fraction", "prefill_tokens_per_s", "prefill_hit_rate",
    "prefill_stall_seconds", "same_tokens_as_full", "decode_h2d_bytes_per_token", "prefill_h2d_bytes",
    "decode_copies_per_token",
}


def test_bench_reports_every_policy_and_ratio_with_identical_tokens(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no calibrated predictor for the tiny model
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
    # Which experts are still loading when the next one misses (never victims) depends on the
    # link's timing, so a policy's few decode tokens here now and then find everything resident.
    assert rows[0]["decode_copies_per_token"] == 0 and any(row["decode_copies_per_token"] > 0 for row in rows[1:])
    assert "1 blank line of" in err and "skipped: one prompt a line" in err and report["context_cut"] == []
    # The same prompts for every policy; full ran them before and after every row too.
    assert len({row["tokens"] for row in rows[1:]}) == 1 and rows[0]["tokens"] == 9 * rows[1]["tokens"]
    assert "one expert's bytes take 3.94 x" in report["link"] and "before every run" in report["link"]
    # Each run's link was set from full's speed just before it: a copy takes about the setup's 3.94 layers.
    assert all(row["copy_layers"] > 1.0 for row in rows[1:]) and rows[0]["copy_layers"] is None
    assert all(row["cache_slots"] < rows[0]["cache_slots"] for row in rows[1:])  # the policy's cache, not full's
    # The bound no policy passes, from the prompts' recorded accesses at the setup's copy/compute ratio.
    (bound,) = report["bounds"]
    assert bound["cache_ratio"] == 0.5 and bound["min_copies_per_token"] >= 0 and 0 < bound["copy_bound_ratio_to_full"] <= 1
    assert "Belady's MIN" in err
    # The full row's tok/s is the mean of all its runs, a row's vs full its own bracketing runs: said under the table.
    assert "vs full: each run against the two full runs around it" in err
    stream = report["event_stream"]
    assert stream["events_per_token"] > 0 and stream["tokens_per_s_with_listener"] > 0
    assert "event stream:" in err and "oracle" in err
    # seqmoe ran on the router fallback, and the report says so.
    assert report["predictor"] is None and "no calibrated predictor" in err and "seqmoe calibrate --model" in err


def test_bench_says_what_it_sent_and_what_the_context_cut(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = without_chat_template(mixtral_dir, tmp_path / "plain")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n\n  \nhi\n", encoding="utf-8")  # plain text: 11 and 2 tokens
    status = main(["bench", "--model", str(model), "--device", "cpu", "--prompts", str(prompts), "--policies", "lru",
                   "--cache-ratios", "0.5", "--max-new-tokens", "6", "--context", "14", "--json"])
    out, err = capsys.readouterr()
    assert status == 0
    assert f"2 blank lines of {prompts} skipped" in err
    assert "plain has no chat template: the prompts went to it as plain text" in err
    # The first reply had room for 3 tokens of the 6 asked for; the second, all 6.
    assert "the 14-token context cut replies short: prompt 1 at 3 tokens\n" in err
    assert json.loads(out)["context_cut"] == [{"prompt": 1, "tokens": 3}]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-new-tokens", "1"], "--max-new-tokens must be at least 2"),
        (["--cache-ratios", "0.5,half"], "--cache-ratios takes shares of all experts"),
        (["--cache-ratios", "1.5"], "above 0 and at most 1"),
        (["--policies", ","], "--policies names no policy"),
        (["--policies", "lru,belady"], "unknown policy 'belady'"),
        (["--prompts", "{missing}"], "cannot read the prompts file"),
        (["--prompts", "{empty}"], "holds no prompts"),
        (["--prompts", "{long}"], "prompt 2: the prompt is"),
    ],
)
def test_bench_refuses_bad_flags_in_one_line(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    long = tmp_path / "long.txt"
    long.write_text("Hi\n" + "a" * 300 + "\n", encoding="utf-8")  # past the tiny model's 256 positions
    flags = [f.format(missing=tmp_path / "missing.txt", empty=empty, long=long) for f in flags]
    status = main(["bench", "--model", str(mixtral_dir), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--policy", "lru"], ["--vram-budget", "1"]])
def test_bench_refuses_the_single_cache_flags_it_would_ignore(
    mixtral_dir: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--model", str(mixtral_dir), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and f"unrecognized arguments: {' '.join(flags)}" in err


def test_bench_cache_ratio_is_read_as_its_cache_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse takes a unique prefix for the whole flag: what the user meant, not ignored.
    args = build_parser().parse_args(["bench", "--cache-ratio", "0.3"])
    assert args.cache_ratios == "0.3" and not hasattr(args, "cache_ratio")


def test_a_plot_without_matplotlib_is_refused_before_the_run(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    status = main(["bench", "--model", str(mixtral_dir), "--device", "cpu", "--plot", str(tmp_path / "p.png")])
    out, err = capsys.readouterr()
    assert status == 2 and "--plot needs matplotlib" in err and out == ""


def test_a_plot_matplotlib_cannot_write_is_refused_before_the_run(
    mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", ModuleType("matplotlib"))  # present, whether installed or not
    monkeypatch.setattr(seqmoe.bench, "run_bench", never_run)
    plot = tmp_path / "bench.txt"
    status = main(["bench", "--model", str(mixtral_dir), "--device", "cpu", "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.strip() == f"seqmoe: error: --plot {plot}: give a file name ending in .png, .pdf, .svg"


def never_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("the bench ran for a plot it could not write")


def test_a_plot_that_fails_to_draw_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [SimpleNamespace(policy="lru", cache_ratio=0.5, ratio_to_full=0.4)]
    # A "$" in a path of the title is text, not a formula matplotlib fails to parse.
    plot(rows, [], tmp_path / "plots" / "ok.png", r"predictor /home/a$x^$/p.safetensors")  # its folder made
    assert (tmp_path / "plots" / "ok.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SeqMoEError) as refused:
        plot(rows, [], tmp_path / "bench.raw.gz", "title")  # a suffix matplotlib has no writer for
    assert "\n" not in str(refused.value) and str(refused.value).startswith(f"cannot write {tmp_path / 'bench.raw.gz'}: ")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plots"]  # nothing half written


def test_a_reply_that_ends_at_its_first_token_is_benched_with_the_others(mixtral_dir: Path) -> None:
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("full")
    short = [5, 17, 42]
    # The short prompt's first reply token becomes the end of text, so its reply has no decode.
    engine.loaded.model.generation_config.eos_token_id = engine.generate(short, Sampling(max_new_tokens=1)).token_ids[0]
    others = ([p, p + 3, p + 7, p + 11] for p in range(20, 90))
    longer = next(p for p in others if len(engine.generate(p, Sampling(max_new_tokens=6)).token_ids) == 6)
    with pytest.raises(SeqMoEError, match="no decode to time"):
        run_bench(engine, [short], ["lru"], [0.5], 6, copy_layers=2.0)
    gbps = engine.link_gbps
    with pytest.raises(SeqMoEError, match="no decode to time"):
        match_link(engine, DEFAULT_SETUP, [short])
    assert (engine.link_gbps, engine.link_setup) == (gbps, None), "a link that could not be timed stays as it was"
    result = run_bench(engine, [short, longer], ["lru"], [0.5], 6, copy_layers=2.0)
    full, lru = result.rows
    assert lru.same_tokens and lru.totals.decode_tokens == 5
    # Per decode token, as the hit rate and the copies are: each reply's first token comes from prefill.
    stall = lru.totals.total("decode_stall_seconds")
    assert stall > 0 and lru.totals.as_dict()["stall_seconds_per_token"] == pytest.approx(stall / 5)
    (bound,) = result.bounds
    assert bound.copies_per_token <= lru.totals.total("decode_misses") / 5
    assert 0 < lru.ratio_to_full <= 1.5 and lru.copy_layers is not None


def test_a_link_matched_to_a_setup_copies_in_its_layers_of_full_decode_unseen_by_listeners(mixtral_dir: Path) -> None:
    engine = Engine(load_model(str(mixtral_dir), device="cpu"), link_gbps=25.0)
    seen: list = []
    engine.events.subscribe(seen.append)
    gbps = match_link(engine, DEFAULT_SETUP)
    assert seen == [], "the timing runs are nobody's replies"
    assert engine.policy_name == "full" and engine.link_gbps == gbps < 25.0 and engine.link_setup == DEFAULT_SETUP
    # One copy takes the setup's 3.94 layers of full's decode, timed again here (wide bounds: a shared machine's speed drifts).
    full = full_speed(engine, [[5, 17, 42], [20, 23, 27, 31]], Sampling(max_new_tokens=6))
    assert 1.0 < emulated_copy_seconds(engine) / layer_seconds(full, engine.loaded.host.num_layers) < 16.0
    engine.configure("lru", cache_ratio=0.5)
    engine.generate([5, 17, 42], Sampling(max_new_tokens=3))
    assert seen, "the listeners hear the replies after it"
    engine.close()
    with pytest.raises(SeqMoEError, match="only an emulated link"):
        match_link(SimpleNamespace(link="cuda"), DEFAULT_SETUP)


def test_the_plot_title_keeps_its_lines_apart() -> None:
    title = wrapped("Qwen3MoeForCausalLM, 15 prompts x 40 tokens; " + "link " * 30 + "\nseqmoe forecasts with the predictor p")
    assert title.splitlines()[-1] == "seqmoe forecasts with the predictor p"
    assert all(len(line) <= 110 for line in title.splitlines())


def test_packed_experts_count_as_copies_and_take_less_of_the_link(tiny_models: dict[str, Path]) -> None:
    """In bfloat16 the experts cross the link packed: the bench counts experts copied, not the
    bytes over an expert's size."""
    engine = Engine(load_model(str(tiny_models["mixtral"]), device="cpu", dtype="bfloat16"))
    assert 0.74 < engine.loaded.host.packed_share < 0.78
    (_, lru) = run_bench(engine, [PROMPT], ["lru"], [0.5], max_new_tokens=8, copy_layers=2.0).rows
    misses = lru.totals.total("decode_misses") / lru.totals.decode_tokens
    assert misses > 0 and lru.as_dict()["decode_copies_per_token"] == pytest.approx(misses, rel=0.01)  # lru copies its misses


def test_bench_refuses_a_setup_with_a_link_speed_before_loading_the_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.cli, "load_engine", never_run)
    status = main(["bench", "--setup", DEFAULT_SETUP, "--link-gbps", "10"])
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: give --setup or --link-gbps, not both: a setup sets the link's speed\n")


def test_bench_refuses_a_setup_on_a_real_link(
    mixtral_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Engine, "link", property(lambda engine: "cuda"))  # as on a GPU, whose copies are real
    monkeypatch.setattr(seqmoe.bench, "run_bench", never_run)
    status = main(["bench", "--model", str(mixtral_dir), "--device", "cpu", "--setup", DEFAULT_SETUP])
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: only an emulated link can be matched to a setup; this engine copies over cuda: "
        "drop --setup, or emulate the link with --device cpu\n")


def test_prompts_are_lines_split_at_newlines_only_without_a_byte_order_mark(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("\ufeffHi\u2028there\r\n\r\nsecond\x85line\x0cend\n".encode())
    assert read_prompts(prompts) == (["Hi\u2028there", "second\x85line\x0cend"], 1)
