"""Routing traces, predictor training, refusal of a foreign predictor, and the forecast metrics."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import seqmoe.trace
from seqmoe import Engine, SeqMoEError, load_model
from seqmoe.cli import main
from seqmoe.predictor import PredictorConfig, load_predictor, save_predictor
from seqmoe.predictor.evaluation import evaluate, frequency_scorer, hits_at, previous_token_scorer
from seqmoe.predictor.samples import Positions, positions_of, split_documents
from seqmoe.predictor.training import TrainingOptions, train_predictor, validation_loss
from seqmoe.router_probe import same_answers
from seqmoe.routers import find_routers
from seqmoe.trace import Document, RoutingRecorder, model_identity, read_documents, read_traces, trace_document, write_traces

from .conftest import CHAT_TEXT, FAMILIES, build_model, without_chat_template

def test_trace_round_trip_records_the_routers_real_choice(traced: tuple[Path, Path]) -> None:
    model_dir, out = traced
    traces = read_traces(out)
    manifest = traces.manifest
    tokens, layers, k, experts = manifest["tokens"], manifest["layers"], manifest["top_k"], manifest["experts"]
    assert (manifest["documents"], layers, experts, k) == (12, 3, 8, 4)
    assert manifest["decode_tokens"] > 0 and manifest["prefill_tokens"] > manifest["decode_tokens"]
    assert traces.hidden.shape == (tokens, layers, 32) and traces.hidden.dtype == torch.float16
    assert traces.experts.shape == (tokens, layers, k)
    assert traces.probs.shape == (tokens, layers, experts)
    # Qwen3-MoE routes to the top-k of its softmax: the recorded choice must be exactly that
    # (up to ties in the float16 probabilities).
    probs = traces.probs.float()
    kth_best = probs.topk(k, dim=-1).values[..., -1:]
    chosen = probs.gather(-1, traces.experts.long())
    assert (chosen >= kth_best - 1e-3).all()
    assert (traces.experts.long().sort(dim=-1).values.diff(dim=-1) > 0).all()
    # The recorded hidden state is what the router saw.
    engine = Engine(load_model(str(model_dir), device="cpu"))
    router = find_routers(engine.loaded)[1]
    with torch.no_grad():
        logits = router.weight @ traces.hidden[:5, 1].float().T
    assert torch.allclose(torch.softmax(logits.T, dim=-1), traces.probs[:5, 1].float(), atol=2e-3)
    assert manifest["model"] == model_identity(engine.loaded)


def test_a_re_trace_stopped_midway_leaves_no_trace_to_read(
    traced: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    old = read_traces(folder)
    monkeypatch.setattr(seqmoe.trace, "SHARD_TOKENS", 1)

    def stopped() -> Iterator[dict[str, torch.Tensor]]:
        yield {"document": torch.zeros(3, dtype=torch.int32), "decode": torch.zeros(3, dtype=torch.uint8)}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_traces(folder, old.manifest["model"], stopped())
    with pytest.raises(SeqMoEError, match="no manifest"):
        read_traces(folder)


def test_a_traced_continuation_is_decode_for_an_engines_cache(mixtral_dir: Path) -> None:
    engine = Engine(load_model(str(mixtral_dir), device="cpu"))
    engine.configure("lru", cache_ratio=0.5)
    recorder = RoutingRecorder(engine.loaded)
    try:
        record = trace_document(engine.loaded, recorder, Document([5], 4))
        decode, prefill = engine.cache.phases["decode"], engine.cache.phases["prefill"]
    finally:
        recorder.close()
        engine.close()
    # A one-token prompt is prefill; each greedy token is a decode step of 3 layers of top-2.
    assert prefill.hits + prefill.misses == 3 * 2
    assert decode.hits + decode.misses == int(record["decode"].sum()) * 3 * 2 > 0


def test_a_shard_that_is_not_the_one_the_manifest_lists_is_refused(traced: tuple[Path, Path], tmp_path: Path) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][0]["tokens"] += 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SeqMoEError, match="is not the one manifest.json lists"):
        read_traces(folder)


@pytest.mark.parametrize("damage", [{"shards": []}, {"shards": None}, {"model": None}, {"shards": [{"file": 3}]}, {"model": {}}])
@pytest.mark.parametrize("command", [["simulate", "--policies", "lru"], ["train-predictor", "--out", "p.safetensors"]])
def test_a_damaged_manifest_is_refused_in_one_line(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: dict, command: list[str]
) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(damage)
    manifest = {key: value for key, value in manifest.items() if value is not None}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    command = [str(tmp_path / arg) if arg.endswith(".safetensors") else arg for arg in command]
    status = main([*command, "--traces", str(folder)])
    err = capsys.readouterr().err
    assert status == 2 and err == (f"seqmoe: error: {folder / 'manifest.json'} is damaged: it lacks the traced model "
                                   "or the list of shards; trace again\n")


def test_a_shard_without_the_tensors_of_a_trace_is_refused(traced: tuple[Path, Path], tmp_path: Path) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    shard = folder / "shard-00000.safetensors"
    tensors = load_file(str(shard))
    del tensors["probs"]
    save_file(tensors, str(shard))
    with pytest.raises(SeqMoEError, match="is not the one manifest.json lists"):
        read_traces(folder)


@pytest.mark.parametrize("damage", [
    lambda t: t["experts"].add_(100),  # expert ids the model does not have
    lambda t: t.update(experts=t["experts"].float()),
    lambda t: t.update(probs=t["probs"][:, :, :-1].contiguous()),
    lambda t: t.update(hidden=t["hidden"][:, 0].contiguous()),
])
def test_shard_tensors_unlike_the_traced_model_are_refused(traced: tuple[Path, Path], tmp_path: Path, damage) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    for shard in folder.glob("shard-*.safetensors"):
        tensors = load_file(str(shard))
        damage(tensors)
        save_file(tensors, str(shard))
    with pytest.raises(SeqMoEError, match="do not hold the shapes of the model manifest.json names"):
        read_traces(folder)


def test_training_lowers_validation_loss_and_saves_a_loadable_predictor(traced: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, out = traced
    predictor = train_predictor(read_traces(out), TrainingOptions(epochs=4, width=32, horizon=4), progress=False)
    report = predictor.config.report
    assert report["validation_loss"] < report["initial_validation_loss"]
    path = tmp_path / "p.safetensors"
    save_predictor(predictor, path)
    engine = Engine(load_model(str(model_dir), device="cpu"))
    loaded = load_predictor(path, model_identity(engine.loaded))
    hidden, routed = torch.randn(32), torch.tensor([0, 1, 2, 3])
    assert torch.equal(loaded.predict(hidden, 1, routed), predictor.predict(hidden, 1, routed))
    assert loaded.predict(hidden, 1, routed).shape == (4, 8)


def test_training_that_makes_every_epoch_worse_keeps_the_weights_it_reports(traced: tuple[Path, Path]) -> None:
    traces = read_traces(traced[1])
    options = TrainingOptions(epochs=2, width=16, horizon=2, learning_rate=1e3, reuse=False)
    predictor = train_predictor(traces, options, progress=False)
    report = predictor.config.report
    assert report["best_epoch"] == 0 and report["validation_loss"] == report["initial_validation_loss"]
    positions = positions_of(traces, 2)
    held = positions.subset(split_documents(traces.document, traces.paragraph)[1])
    assert validation_loss(predictor, positions, held, options.batch_size) == pytest.approx(report["validation_loss"])


def test_a_predictor_write_cut_short_leaves_the_earlier_one(
    traced: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = read_traces(traced[1])
    path = tmp_path / "p.safetensors"
    save_predictor(train_predictor(traces, TrainingOptions(epochs=1, width=16, horizon=2), progress=False), path)
    before = path.read_bytes(), path.with_suffix(".json").read_text()
    wider = train_predictor(traces, TrainingOptions(epochs=1, width=24, horizon=2), progress=False)

    def full_disk(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SeqMoEError, match="No space left on device"):
        save_predictor(wider, path)
    monkeypatch.undo()
    assert (path.read_bytes(), path.with_suffix(".json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.safetensors"]


def test_a_report_number_that_is_not_finite_is_saved_as_null(traced: tuple[Path, Path], tmp_path: Path) -> None:
    # A reuse loss over held-out documents without decode tokens is NaN; json wrote a bare NaN, no JSON.
    predictor = train_predictor(read_traces(traced[1]), TrainingOptions(epochs=1, width=16, horizon=2), progress=False)
    predictor.config.report.update(reuse_validation_loss=math.nan, reuse_rate_rule_loss=math.inf)
    path = tmp_path / "p.safetensors"
    save_predictor(predictor, path)

    def strict(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    report = json.loads(path.with_suffix(".json").read_text(), parse_constant=strict)["report"]
    assert report["reuse_validation_loss"] is None and report["reuse_rate_rule_loss"] is None
    assert report["validation_loss"] == predictor.config.report["validation_loss"]
    assert load_predictor(path).config.report["reuse_validation_loss"] is None


@pytest.mark.parametrize("steps", [2, 4, 10])
def test_training_runs_however_few_steps_the_text_gives(traced: tuple[Path, Path], steps: int) -> None:
    traces = read_traces(traced[1])
    train_docs, _ = split_documents(traces.document)
    positions = positions_of(traces, 2).subset(train_docs).numel()
    options = TrainingOptions(epochs=2, width=16, horizon=2, batch_size=math.ceil(positions / (steps // 2)), reuse=False)
    predictor = train_predictor(traces, options, progress=False)
    assert predictor.config.report["validation_loss"] < predictor.config.report["initial_validation_loss"]


def test_a_forecast_is_the_trained_network_for_one_token_at_every_layer(traced: tuple[Path, Path]) -> None:
    _, out = traced
    traces = read_traces(out)
    predictor = train_predictor(traces, TrainingOptions(epochs=1, width=16, horizon=3), progress=False)
    for layer in range(predictor.config.num_layers):
        hidden, routed = traces.hidden[5, layer].float(), traces.experts[5, layer]  # int16, as the simulator passes them
        with torch.no_grad():
            logits = predictor(hidden.unsqueeze(0), torch.tensor([layer]), routed.long().unsqueeze(0))[0]
        assert torch.allclose(predictor.predict(hidden, layer, routed), torch.sigmoid(logits), atol=1e-6)
    with torch.no_grad():  # tables made from weights that change later must not be kept
        predictor.head.bias.add_(1.0)
    predictor.train(False)
    with torch.no_grad():
        logits = predictor(hidden.unsqueeze(0), torch.tensor([layer]), routed.long().unsqueeze(0))[0]
    assert torch.allclose(predictor.predict(hidden, layer, routed), torch.sigmoid(logits), atol=1e-6)


def test_the_engine_uses_the_predictor_file_it_was_last_given(traced: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, out = traced
    traces = read_traces(out)
    engine = Engine(load_model(str(model_dir), device="cpu"))
    for width in (32, 16):
        path = tmp_path / f"w{width}.safetensors"
        save_predictor(train_predictor(traces, TrainingOptions(epochs=1, width=width, horizon=2), progress=False), path)
        engine.predictor_path = path
        assert engine.predictor().config.width == width


def test_predictor_for_another_model_is_refused(traced: tuple[Path, Path], tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = traced
    predictor = train_predictor(read_traces(out), TrainingOptions(epochs=1, width=16), progress=False)
    path = tmp_path / "qwen3.safetensors"
    save_predictor(predictor, path)
    other = Engine(load_model(str(tiny_models["olmoe"]), device="cpu"))
    with pytest.raises(SeqMoEError, match="trained for qwen3_moe"):
        load_predictor(path, model_identity(other.loaded))
    text = tmp_path / "t.txt"
    text.write_text("hello")
    status = main(["eval-predictor", "--model", str(tiny_models["olmoe"]), "--text", str(text),
                   "--predictor", str(path), "--device", "cpu"])
    assert status == 2
    assert "calibrate" in capsys.readouterr().err


def test_a_predictor_for_other_weights_saved_under_the_same_config_is_refused(
    traced: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, out = traced
    path = tmp_path / "qwen3.safetensors"
    save_predictor(train_predictor(read_traces(out), TrainingOptions(epochs=1, width=16), progress=False), path)
    retrained = build_model(tmp_path / "again" / model_dir.name, FAMILIES["qwen3_moe"], seed=1)
    assert (retrained / "config.json").read_bytes() == (model_dir / "config.json").read_bytes()
    with pytest.raises(SeqMoEError, match="trained for other weights of qwen3_moe"):
        load_predictor(path, model_identity(load_model(str(retrained), device="cpu")))
    assert load_predictor(path, model_identity(load_model(str(model_dir), device="cpu"))) is not None


def test_a_predictor_saved_before_routers_were_fingerprinted_is_still_used(traced: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, out = traced
    path = tmp_path / "old.safetensors"
    save_predictor(train_predictor(read_traces(out), TrainingOptions(epochs=1, width=16), progress=False), path)
    config = json.loads(path.with_suffix(".json").read_text())
    del config["model"]["routers_sha256"]
    path.with_suffix(".json").write_text(json.dumps(config))
    assert load_predictor(path, model_identity(load_model(str(model_dir), device="cpu"))).config.width == 16


def test_the_routers_fingerprint_does_not_depend_on_the_dtype_the_model_is_loaded_in(traced: tuple[Path, Path]) -> None:
    model_dir, _ = traced
    digests = {model_identity(load_model(str(model_dir), device="cpu", dtype=dtype))["routers_sha256"] for dtype in ("float32", "bfloat16")}
    assert len(digests) == 1


def test_a_predictor_serves_its_model_loaded_in_float16(traced: tuple[Path, Path], tmp_path: Path) -> None:
    # float16 rounds the routers' weights otherwise than bfloat16: their digest differs, and the
    # model's own predictor was refused as made for other weights.
    model_dir, out = traced
    path = tmp_path / "p.safetensors"
    save_predictor(train_predictor(read_traces(out), TrainingOptions(epochs=1, width=16), progress=False), path)
    half = model_identity(load_model(str(model_dir), device="cpu", dtype="float16"))
    assert half["routers_sha256"] != json.loads(path.with_suffix(".json").read_text())["model"]["routers_sha256"]
    assert load_predictor(path, half).config.width == 16
    retrained = build_model(tmp_path / "again" / model_dir.name, FAMILIES["qwen3_moe"], seed=1)
    with pytest.raises(SeqMoEError, match="trained for other weights"):  # other routers stay refused in any dtype
        load_predictor(path, model_identity(load_model(str(retrained), device="cpu", dtype="float16")))


@pytest.mark.parametrize("answers", [None, "text", [], [[["NaN"]]], [[[1.0, 2.0]]], [[[float("nan"), 1.0, 2.0]]]])
def test_router_answers_that_are_not_the_routers_own_never_match(traced: tuple[Path, Path], answers: object) -> None:
    identity = model_identity(load_model(str(traced[0]), device="cpu"))
    assert same_answers(identity["routers_answers"], identity["routers_answers"])
    assert not same_answers(answers, identity["routers_answers"]) and not same_answers(identity["routers_answers"], answers)


def test_eval_predictor_reports_what_the_predictor_costs_a_decode_step(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = traced
    path = tmp_path / "p.safetensors"
    save_predictor(train_predictor(read_traces(out), TrainingOptions(epochs=1, width=16), progress=False), path)
    text = tmp_path / "t.txt"
    text.write_text(CHAT_TEXT)
    status = main(["eval-predictor", "--model", str(model), "--text", str(text), "--predictor", str(path),
                   "--continuation", "2", "--max-tokens", "200", "--json", "--device", "cpu"])
    assert status == 0
    out, err = capsys.readouterr()
    cost = json.loads(out)["predictor"]
    assert cost["file"] == str(path) and f"predictor {path}: " in err  # which predictor was evaluated
    assert cost["stride"] == 1 and cost["forecasts_per_decode_step"] == pytest.approx(3, abs=0.5)  # 3 MoE layers
    assert cost["ms_per_forecast"] > 0 and 0 < cost["cost_fraction_of_decode_step"] < 1


def test_generate_names_the_predictor_seqmoe_forecasts_with_or_its_router_fallback(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqmoe.predictor.calibration import user_predictor_path

    model, out = traced
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no calibrated predictor yet
    argv = ["generate", "--model", str(model), "--device", "cpu", "--prompt", "hi", "--max-new-tokens", "3",
            "--policy", "seqmoe", "--json"]
    assert main(argv) == 0
    out_text, err = capsys.readouterr()
    assert json.loads(out_text)["predictor"] is None and "no calibrated predictor" in err
    traces = read_traces(out)
    path = user_predictor_path(traces.manifest["model"])
    save_predictor(train_predictor(traces, TrainingOptions(epochs=1, width=16), progress=False), path)
    assert main(argv) == 0
    out_text, err = capsys.readouterr()
    assert json.loads(out_text)["predictor"] == str(path) and f"seqmoe forecasts with the predictor {path}" in err


def test_a_damaged_predictor_file_is_named_in_one_line(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = traced
    traces = read_traces(out)
    path, wider = tmp_path / "p.safetensors", tmp_path / "wider.safetensors"
    save_predictor(train_predictor(traces, TrainingOptions(epochs=1, width=16), progress=False), path)
    save_predictor(train_predictor(traces, TrainingOptions(epochs=1, width=24), progress=False), wider)
    weights = path.read_bytes()
    path.write_bytes(b"not safetensors at all")
    status = main(["simulate", "--traces", str(out), "--policies", "seqmoe", "--predictor", str(path)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"seqmoe: error: predictor {path} cannot be read: ") and len(err.splitlines()) == 1
    path.write_bytes(wider.read_bytes())  # whole, but not the weights its config describes
    with pytest.raises(SeqMoEError, match="does not hold the weights p.json describes") as refused:
        load_predictor(path)
    assert "\n" not in str(refused.value)
    path.write_bytes(weights)
    assert load_predictor(path).config.width == 16


def test_a_predictor_config_with_values_of_the_wrong_kind_is_refused_in_one_line(traced: tuple[Path, Path], tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save_predictor(train_predictor(read_traces(traced[1]), TrainingOptions(epochs=1, width=16), progress=False), path)
    config = json.loads(path.with_suffix(".json").read_text())
    edits = [{"width": "abc"}, {"horizon": -1}, {"top_k": "2"}, {"model": 5}, {"frequency": "x"}, {"frequency": [[0.5]]},
             {"reuse_horizons": [2, 1]}, {"width": 10**8}, {"horizon": 10**6}]
    for edit in edits:
        path.with_suffix(".json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(SeqMoEError, match="p.json is not a predictor config of this seqmoe version: ") as refused:
            load_predictor(path)
        assert "\n" not in str(refused.value), edit


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_predictor_config_whose_frequency_is_not_finite_is_refused(number: str) -> None:
    # Python's json reads these; the prior eviction starts from came out NaN.
    text = f'{{"hidden_size": 4, "num_layers": 1, "num_experts": 2, "top_k": 1, "frequency": [[0.5, {number}]]}}'
    with pytest.raises(ValueError, match="frequency must hold finite numbers"):
        PredictorConfig(**json.loads(text))


def test_hits_count_the_actual_experts_among_the_best_scores() -> None:
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.3], [0.2, 0.7, 0.1, 0.6]])
    actual = torch.tensor([[0, 3], [1, 3]])
    assert hits_at(scores, actual, 2).tolist() == [1, 2]
    assert hits_at(scores, actual, 3).tolist() == [2, 2]


def hand_made_positions() -> Positions:
    """One document of 3 tokens x 2 layers, 4 experts, top-1, horizon 2."""
    experts = torch.tensor([[0], [1], [0], [2], [3], [2]])
    return Positions(
        hidden=torch.zeros(6, 1), layer=torch.tensor([0, 1, 0, 1, 0, 1]), experts=experts,
        document=torch.zeros(6, dtype=torch.long),
        target=torch.tensor([[1, 2], [2, 3], [3, 4], [4, 5], [5, -1], [-1, -1]]), num_layers=2, num_experts=4,
    )


def test_recall_by_horizon_on_a_hand_made_trace() -> None:
    positions = hand_made_positions()
    frequency = torch.tensor([[0.5, 0.1, 0.1, 0.3], [0.1, 0.2, 0.6, 0.1]])
    result = evaluate(positions, {"freq": frequency_scorer(frequency, positions),
                                  "prev": previous_token_scorer(frequency, positions)})
    # freq always guesses expert 0 at layer 0 and expert 2 at layer 1.
    # horizon 1 targets: p1 (layer 1, expert 1), p2 (0, 0), p3 (1, 2), p4 (0, 3), p5 (1, 2) -> 3 of 5
    # horizon 2 targets: p2 (0, 0), p3 (1, 2), p4 (0, 3), p5 (1, 2) -> 3 of 4
    assert result["methods"]["freq"]["recall@k"] == pytest.approx([3 / 5, 3 / 4])
    # prev guesses the expert the previous token used at the target layer; the first token has none.
    # horizon 1: p1 -> freq (2, miss), p2 -> p0 (0, hit), p3 -> p1 (1, miss), p4 -> p2 (0, miss), p5 -> p3 (2, hit)
    assert result["methods"]["prev"]["recall@k"][0] == pytest.approx(2 / 5)
    assert result["methods"]["prev"]["precision@k"] == result["methods"]["prev"]["recall@k"]


def test_prev_guesses_from_the_last_run_of_the_target_layer_known_when_forecasting() -> None:
    """A horizon past the next token's same layer (a predictor trained with a horizon above the
    layer count) must not read a run that comes after the forecast: tokens here come in pairs that
    route alike, so the token right before the target knows its pair, the runs known do not."""
    experts = torch.tensor([[0], [1], [0], [1], [2], [3], [2], [3]])  # 4 tokens x 2 layers, top-1
    target = torch.tensor([[p + h if p + h < 8 else -1 for h in (1, 2, 3)] for p in range(8)])
    positions = Positions(hidden=torch.zeros(8, 1), layer=torch.tensor([0, 1] * 4), experts=experts,
                          document=torch.zeros(8, dtype=torch.long), target=target, num_layers=2, num_experts=4)
    frequency = torch.tensor([[0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.7, 0.1]])
    result = evaluate(positions, {"prev": previous_token_scorer(frequency, positions)})
    # Horizon 3 from p reaches p + 3; the target layer's last known run is p + 3 - 4 (-1 for p0: freq).
    # p0 -> 1 (freq: 2), p1 -> 2 (p0: 0), p2 -> 3 (p1: 1), p3 -> 2 (p2: 0), p4 -> 3 (p3: 1): none.
    assert result["methods"]["prev"]["recall@k"][2] == 0.0


def test_positions_wrap_into_the_next_token_but_not_the_next_document(traced: tuple[Path, Path]) -> None:
    traces = read_traces(traced[1])
    positions = positions_of(traces, horizon=4)
    layers = positions.num_layers
    first_of_second_doc = int((traces.document == 1).nonzero()[0]) * layers
    assert positions.target[0].tolist() == [1, 2, 3, 4]
    assert positions.target[first_of_second_doc - 1].tolist() == [-1, -1, -1, -1]


def test_every_turn_makes_a_document_of_the_conversation_up_to_each_user_turn() -> None:
    text = "u1\na1\nu2\na2\nu3\n\n\nv1\nb1\nv2\nb2\n"
    once = read_documents(text, lambda lines: lines)
    assert [(d.ids, d.paragraph) for d in once] == [(["u1", "a1", "u2", "a2", "u3"], 0), (["v1", "b1", "v2", "b2"], 1)]
    every = read_documents(text, lambda lines: lines, every_turn=True)
    assert [(d.ids, d.paragraph) for d in every] == [
        (["u1"], 0), (["u1", "a1", "u2"], 0), (["u1", "a1", "u2", "a2", "u3"], 0), (["v1"], 1), (["v1", "b1", "v2"], 1),
    ]


def test_the_documents_of_one_conversation_are_never_split_between_training_and_validation() -> None:
    # Twelve conversations traced at every turn: three documents each, beginning alike.
    documents = torch.arange(36).repeat_interleave(5)
    paragraphs = documents // 3
    train, held = split_documents(documents, paragraphs)
    assert held == {27, 28, 29} and train == set(range(36)) - held
    # Traces recorded before paragraphs were kept: each document is its own.
    assert split_documents(documents)[1] == {9, 19, 29}


def test_trace_every_turn_replies_to_each_user_turn(traced: tuple[Path, Path], tmp_path: Path) -> None:
    model, once = traced
    text = tmp_path / "chat.txt"
    text.write_text(CHAT_TEXT)
    out = tmp_path / "every-turn"
    assert main(["trace", "--model", str(model), "--text", str(text), "--chat", "--every-turn", "--continuation", "6",
                 "--out", str(out), "--device", "cpu"]) == 0
    assert read_traces(once).manifest["documents"] == 12 and read_traces(out).manifest["documents"] == 24
    # Each conversation's two documents keep its paragraph, so training holds out both or neither.
    every = read_traces(out)
    pairs = {(d, p) for d, p in zip(every.document.tolist(), every.paragraph.tolist())}
    assert len(pairs) == 24 and {p for _, p in pairs} == set(range(12))


def test_every_turn_without_chat_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqmoe.cli

    monkeypatch.setattr(seqmoe.cli, "load_engine", lambda args: pytest.fail("the model was loaded"))
    text = tmp_path / "chat.txt"
    text.write_text(CHAT_TEXT)
    status = main(["trace", "--text", str(text), "--out", str(tmp_path / "t"), "--every-turn"])
    assert status == 2 and capsys.readouterr().err == (
        "seqmoe: error: --every-turn needs --chat: it traces a conversation once per user turn\n")


def test_calibration_traces_a_reply_to_every_user_turn_within_its_budget(tiny_models: dict[str, Path]) -> None:
    from seqmoe.predictor.calibration import collect_traces

    loaded = load_model(str(tiny_models["mixtral"]), device="cpu")
    every = collect_traces(loaded, CHAT_TEXT, chat=True, max_tokens=10**6, continuation=3, every_turn=True)
    once = collect_traces(loaded, CHAT_TEXT, chat=True, max_tokens=10**6, continuation=3)
    assert every.document.unique().numel() == 24 and once.document.unique().numel() == 12
    assert every.decode.sum() > once.decode.sum()
    # A budget short of the whole text still samples it across conversations, not just the first.
    budget = collect_traces(loaded, CHAT_TEXT, chat=True, max_tokens=200, continuation=3, every_turn=True)
    assert 200 <= budget.tokens < every.tokens


@pytest.mark.parametrize(("text", "tokens", "words"), [
    ("\n\n", "100", "no tokens to trace"),
    ("hello there\nhi, how are you?", "100", "a single document"),
    ("hello there, how was your weekend?\nhi, it was fine\n\nwhat do you cook?\npasta", "5", "ask for more tokens"),
])
def test_calibration_refuses_a_text_it_cannot_learn_from(mixtral_dir: Path, tmp_path: Path, text: str, tokens: str,
                                                         words: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    file = tmp_path / "calibration.txt"
    file.write_text(text)
    status = main(["calibrate", "--model", str(mixtral_dir), "--device", "cpu", "--text", str(file), "--epochs", "1",
                   "--tokens", tokens])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's line
    assert status == 2 and last.startswith("seqmoe: error: ") and words in last, last


def test_calibration_says_when_the_model_has_no_chat_template(
    mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = without_chat_template(mixtral_dir, tmp_path / "plain")
    text = tmp_path / "calibration.txt"
    text.write_text(CHAT_TEXT)
    status = main(["calibrate", "--model", str(model), "--device", "cpu", "--text", str(text), "--epochs", "1",
                   "--tokens", "300"])
    said = capsys.readouterr().err.strip().splitlines()
    assert status == 0 and said[-1] == "plain has no chat template: the calibration text went to it as plain text, each conversation once"
    # It is used before the bundled one from now on, however short its text was: said, with the way back.
    assert said[-3].startswith("seqmoe forecasts plain with this predictor from now on; delete it and plain-")
    assert said[-3].endswith(".json to go back")


class Cancelled(Exception):
    pass


def test_calibration_is_found_again_and_can_be_cancelled(tiny_models: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from seqmoe.predictor.calibration import calibrate, find_predictor, user_predictor_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = tmp_path / "calibration.txt"
    text.write_text(CHAT_TEXT)
    engine = Engine(load_model(str(tiny_models["mixtral"]), device="cpu"))
    engine.configure("full")
    assert find_predictor(engine.loaded) is None

    def cancel_when_training(stage: str, fraction: float) -> None:
        if stage.startswith("Training"):
            raise Cancelled

    with pytest.raises(Cancelled):
        calibrate(engine.loaded, TrainingOptions(epochs=2, width=16), cancel_when_training, text, continuation=4)
    assert find_predictor(engine.loaded) is None
    reports = []
    _, path = calibrate(engine.loaded, TrainingOptions(epochs=2, width=16), lambda s, f: reports.append((s, f)), text,
                        continuation=4)
    assert path == user_predictor_path(model_identity(engine.loaded)) and str(tmp_path) in str(path)
    assert find_predictor(engine.loaded) == path
    stages = [fraction for _, fraction in reports]
    assert stages == sorted(stages) and stages[-1] == 1.0
    # Tracing is half the work, shared by the tokens traced out of the budget (12,000; the text gives far fewer).
    tracing = [fraction for stage, fraction in reports if stage.startswith("Tracing")]
    assert tracing and 0 < tracing[-1] < 0.1
    engine.close()
