"""The predictor's commands: ``trace``, ``train-predictor``, ``eval-predictor``, ``calibrate``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..engine import Engine, Sampling
from ..errors import SeqMoEError
from ..routers import router_logits
from ..trace import (
    chat_tokenizer,
    iter_traces,
    model_identity,
    plain_tokenizer,
    read_documents,
    read_traces,
    write_traces,
)
from ..user_files import read_text
from .calibration import calibrate, collect_traces, find_predictor
from .evaluation import evaluate, frequency_scorer, gate_scorer, predictor_scorer, previous_token_scorer
from .model import check_predictor_output, load_predictor, parameter_limit, save_predictor
from .reuse import evaluate_reuse, reuse_samples
from .samples import positions_of
from .training import TrainingOptions, train_predictor


def run_trace(engine: Engine, args: argparse.Namespace) -> int:
    loaded = engine.loaded
    tokenize = chat_tokenizer(loaded) if args.chat else plain_tokenizer(loaded)
    documents = read_documents(read_text(args.text), tokenize, args.every_turn and args.chat)
    with tqdm(total=args.max_tokens, desc="trace", unit="tok") as bar:  # closed before an error's line, too
        records = iter_traces(loaded, documents, args.continuation, args.max_tokens, bar.update, engine.context_tokens)
        manifest = write_traces(args.out, model_identity(loaded), records)
    print(f"{manifest['tokens']} tokens ({manifest['decode_tokens']} decoded) from {manifest['documents']} documents "
          f"in {len(manifest['shards'])} shards at {args.out}", file=sys.stderr)
    return 0


def run_train(args: argparse.Namespace) -> int:
    check_predictor_output(args.out, "--out")  # before the traces are read and minutes of training
    traces = read_traces(args.traces)
    options = TrainingOptions(horizon=args.horizon, epochs=args.epochs, width=args.width)
    try:
        predictor = train_predictor(traces, options)
    except ValueError as error:
        raise SeqMoEError(str(error)) from None
    save_predictor(predictor, args.out)
    report = predictor.config.report
    print(f"predictor with {report['parameters']:,} parameters, validation loss {report['validation_loss']:.4f} "
          f"(epoch {report['best_epoch']} of {report['epochs_run']}), saved to {args.out}", file=sys.stderr)
    return 0


def run_eval(engine: Engine, args: argparse.Namespace) -> int:
    loaded = engine.loaded
    identity = model_identity(loaded)
    path = args.predictor or find_predictor(loaded)
    if path is None:
        raise SeqMoEError(f"no predictor for {loaded.name} yet: run `seqmoe calibrate --model {loaded.path}`")
    predictor = load_predictor(path, identity, device=loaded.device)
    horizon = args.horizon or predictor.config.horizon
    if not 1 <= horizon <= predictor.config.horizon:
        raise SeqMoEError(f"--horizon must be between 1 and the predictor's {predictor.config.horizon}")
    traces = collect_traces(loaded, read_text(args.text), args.chat, args.max_tokens or 10**9, args.continuation,
                           context=engine.context_tokens)
    positions = positions_of(traces, predictor.config.horizon)
    frequency = torch.tensor(predictor.config.frequency)
    scorers = {
        "seqmoe": predictor_scorer(predictor, positions),
        "gate": gate_scorer(router_logits(loaded), positions),
        "freq": frequency_scorer(frequency, positions),
        "prev": previous_token_scorer(frequency, positions),
    }
    result = {"tokens": traces.tokens, **evaluate(positions, scorers)}
    result["horizons"] = result["horizons"][:horizon]
    for metrics in result["methods"].values():
        for key in metrics:
            metrics[key] = metrics[key][:horizon]
    if predictor.reuse is not None:
        try:
            samples = reuse_samples(traces, predictor.config.prior(), predictor.config.reuse_horizons)
            result["reuse"] = evaluate_reuse(predictor.reuse, samples)
        except ValueError:  # no decode tokens in the text's traces
            pass
    result["predictor"] = {"file": str(path), **_cost(engine, path)}
    if args.json:
        print(json.dumps(result))
    print(format_eval(result), file=sys.stderr)
    return 0


def _cost(engine: Engine, path: Path) -> dict[str, object]:
    """The predictor's cost per decode step, measured inside the engine: the ``seqmoe`` policy
    with every expert cached (no copies), its predictor time against the decode time. With no
    copies the look-ahead's budget is nil, and the policy would space its calls out until it
    never calls; fixed at one call per MoE layer, the cost is the most the engine pays."""
    loaded = engine.loaded
    engine.predictor_path = path
    engine.configure("seqmoe", cache_ratio=1.0)
    policy = engine.cache.policy
    policy.fixed_stride = 1
    prompt = engine.encode("Hi! What do you like to do on weekends?", chat=loaded.has_chat_template)
    engine.generate(prompt, Sampling(max_new_tokens=8))
    calls, seconds, reuse_seconds = policy.calls, policy.predict_seconds, policy.reuse_seconds
    stats = engine.generate(prompt, Sampling(max_new_tokens=48)).stats
    decode_tokens = max(stats.tokens - 1, 1)
    decode_seconds = decode_tokens / max(stats.decode_tokens_per_s, 1e-9)
    calls, seconds = policy.calls - calls, policy.predict_seconds - seconds
    reuse_seconds = policy.reuse_seconds - reuse_seconds
    predictor = engine.predictor()
    return {
        "parameters": sum(p.numel() for p in predictor.parameters()),
        "parameter_limit": parameter_limit(loaded.resident_bytes // loaded.host.layout.dtype.itemsize),
        "ms_per_forecast": 1000 * seconds / max(calls, 1),
        "forecasts_per_decode_step": calls / decode_tokens,
        "stride": policy.stride,
        "reuse_ms_per_token": 1000 * reuse_seconds / decode_tokens,
        "decode_step_ms": 1000 * decode_seconds / decode_tokens,
        "cost_fraction_of_decode_step": (seconds + reuse_seconds) / decode_seconds,
        "device": str(loaded.device),
    }


def format_eval(result: dict[str, object]) -> str:
    horizons = result["horizons"]
    lines = [f"{result['tokens']} tokens, top-k {result['top_k']}; recall@k (recall@2k) per horizon"]
    lines.append(f"{'method':<8}" + "".join(f"{'h=' + str(h):>16}" for h in horizons))
    for name, metrics in result["methods"].items():
        cells = "".join(f"{a:>9.1%} ({b:>4.0%})" for a, b in zip(metrics["recall@k"], metrics["recall@2k"]))
        lines.append(f"{name:<8}{cells}")
    if "reuse" in result:
        reuse = result["reuse"]
        lines.append(
            f"reuse forecast: loss {reuse['reuse_loss']:.4f} on {reuse['samples']} decode tokens "
            f"(the rate rule it corrects: {reuse['rate_rule_loss']:.4f})"
        )
    cost = result["predictor"]
    lines.append(
        f"predictor {cost['file']}: {cost['parameters']:,} parameters, {cost['ms_per_forecast']:.3f} ms per forecast x "
        f"{cost['forecasts_per_decode_step']:.1f} per token (every {cost['stride']} MoE layers) "
        f"+ {cost['reuse_ms_per_token']:.3f} ms of reuse forecast per token = "
        f"{cost['cost_fraction_of_decode_step']:.1%} of a {cost['decode_step_ms']:.1f} ms decode step on {cost['device']}"
    )
    return "\n".join(lines)


def run_calibrate(engine: Engine, args: argparse.Namespace) -> int:
    with tqdm(total=100, desc="calibrate", unit="%") as bar:

        def progress(stage: str, fraction: float) -> None:
            bar.set_description(stage)
            bar.update(round(100 * fraction) - bar.n)

        predictor, path = calibrate(engine.loaded, TrainingOptions(epochs=args.epochs), progress, args.text, args.tokens,
                                    context=engine.context_tokens)
    report = predictor.config.report
    # It comes before any bundled one from now on: said, as a calibration on a short text is no improvement.
    print(f"seqmoe forecasts {engine.loaded.name} with this predictor from now on; delete it and "
          f"{path.with_suffix('.json').name} to go back", file=sys.stderr)
    print(f"calibrated in {report['seconds']:.0f} s of training: validation loss {report['validation_loss']:.4f}; "
          f"predictor saved to {path}", file=sys.stderr)
    if not engine.loaded.has_chat_template:  # calibrate replies to each user turn through the template
        print(f"{engine.loaded.name} has no chat template: the calibration text went to it as plain text, "
              "each conversation once", file=sys.stderr)
    return 0
