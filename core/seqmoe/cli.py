"""The ``seqmoe`` command line. Its flags and JSON keys are a contract for scripts and benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .budget import DEFAULT_CONTEXT_TOKENS
from .errors import SeqMoEError
from .hardware import DEFAULT_SETUP, HARDWARE, SETUPS, SHAPES
from .policies import POLICY_NAMES
from .predictor.calibration import CALIBRATION_TOKENS
from .predictor.model import MAX_HORIZON, MAX_WIDTH
from .reply_text import Decoder, ReplyText
from .resources import demo_model_dir
from .simulate import SIMULATED_POLICIES
from .stop_signals import Terminated, stop_signals_raise
from .user_files import check_output, read_text

if TYPE_CHECKING:
    from .engine import Engine
    from .routers import RouterLogits

DEFAULT_LINK_GBPS = 25.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqmoe", description="Offloaded Mixture-of-Experts inference.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text with an offloaded MoE model")
    add_model_arguments(generate)
    add_cache_arguments(generate, policy="seqmoe")  # as in the app: what the engine is for
    generate.add_argument("--prompt", required=True, help="the prompt text")
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    generate.add_argument("--max-new-tokens", type=int, default=128)
    sampling = generate.add_mutually_exclusive_group()
    sampling.add_argument("--greedy", action="store_true", help="greedy decoding (the default)")
    sampling.add_argument("--temperature", type=float, help="sample at this temperature (0: greedy)")
    generate.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (with --temperature)")
    generate.add_argument("--seed", type=int, help="random seed for sampling")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    generate.add_argument("--setup", choices=sorted(SETUPS),
                          help="match the emulated link to this consumer setup's copy/compute ratio, timed with full "
                               "before the reply, as the app does (instead of --link-gbps)")

    bench = commands.add_parser("bench", help="compare cache policies' decode speed against full residency")
    add_model_arguments(bench)  # its own --policies and --cache-ratios size the caches
    bench.add_argument("--prompts", type=_path, help="one prompt per line (default: a few built-in chat prompts)")
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--policies", default="lru,gate,seqmoe,oracle", help="comma-separated policies to compare with full")
    bench.add_argument("--cache-ratios", default="0.45", help="comma-separated cache ratios")
    bench.add_argument("--setup", choices=sorted(SETUPS),
                       help=f"consumer setup whose transfer/compute ratio sets the emulated link speed (default "
                            f"{DEFAULT_SETUP}; instead of --link-gbps)")
    bench.add_argument("--plot", type=_path,
                       help="write a .png, .pdf or .svg of throughput relative to full (needs matplotlib)")
    bench.add_argument("--json", action="store_true", help="print the rows as JSON")
    bench.add_argument("--event-overhead", action="store_true",
                       help="also measure what a listener on the event stream costs (seqmoe at the first cache ratio)")

    trace = commands.add_parser("trace", help="record routing traces of a model over a text")
    add_model_arguments(trace)
    add_cache_arguments(trace)
    add_text_arguments(trace)
    trace.add_argument("--out", type=_path, required=True, help="folder for the trace shards and manifest")
    trace.add_argument("--every-turn", action="store_true",
                       help="with --chat, trace each conversation once per user turn (the model replies to every turn)")

    train = commands.add_parser("train-predictor", help="train the SeqMoE predictor on routing traces")
    train.add_argument("--traces", type=_path, required=True)
    train.add_argument("--out", type=_path, required=True, help="predictor file (.safetensors; a .json config goes beside it)")
    train.add_argument("--horizon", type=_horizon, default=8, help="how many MoE layers ahead to forecast")
    train.add_argument("--epochs", type=_positive, default=15)
    train.add_argument("--width", type=_width, default=192, help="the predictor's model width")

    evaluate = commands.add_parser("eval-predictor", help="forecast quality of the predictor and the baselines")
    add_model_arguments(evaluate)
    add_cache_arguments(evaluate)
    add_text_arguments(evaluate)
    evaluate.add_argument("--predictor", type=_path, help="predictor file (default: the calibrated or bundled one)")
    evaluate.add_argument("--horizon", type=_positive, help="horizons to report (default: the predictor's)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object to stdout")

    simulate = commands.add_parser("simulate", help="replay routing traces on a virtual GPU, link and model shape")
    simulate.add_argument("--traces", type=_path, required=True)
    simulate.add_argument("--profile", default="rtx4090-pcie4", help="hardware profile: " + ", ".join(HARDWARE))
    simulate.add_argument("--shape", default="olmoe", help="model shape for byte sizes: " + ", ".join(SHAPES))
    simulate.add_argument("--policies", default="lru,seqmoe,oracle",
                          help="comma-separated, of: " + ", ".join(SIMULATED_POLICIES) + " (oracle-next: the oracle seeing one token ahead)")
    simulate.add_argument("--compute-efficiency", type=float, default=1.0,
                          help="share of the GPU's memory bandwidth a decode layer reaches (default 1: the roofline)")
    simulate.add_argument("--packed-share", type=float, default=1.0,
                          help="share of an expert's bytes a copy moves (default 1: raw copies; the engine packs "
                               "bf16 experts, 75%% of their bytes on the demo model: 0.75)")
    simulate.add_argument("--cache-ratios", default="0.2,0.3,0.45,0.6,0.8")
    simulate.add_argument("--predictor", type=_path,
                          help="predictor file for the seqmoe policy (default: the calibrated or bundled one for the traced model)")
    simulate.add_argument("--model", type=_named, help="the traced model's folder or hub id, whose routers the gate policy applies "
                                          "(default: the bundled demo model)")
    simulate.add_argument("--json", action="store_true")

    calibrate = commands.add_parser("calibrate", help="trace the calibration text and train this model's predictor")
    add_model_arguments(calibrate)
    add_cache_arguments(calibrate)
    calibrate.add_argument("--text", type=_path, help="calibration text (default: the one shipped in resources/)")
    calibrate.add_argument("--epochs", type=_positive, default=15)
    calibrate.add_argument("--tokens", type=_positive, default=CALIBRATION_TOKENS,
                           help=f"tokens to trace (default {CALIBRATION_TOKENS}); more take longer and predict better")
    return parser


def _named(text: str) -> str:
    """A model or file name: an empty one would read as the default, or as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a name, not an empty string")
    return text


def _path(text: str) -> Path:
    return Path(_named(text))


def _positive(text: str) -> int:
    return _whole_at_least(text, 1, "a positive whole number")


def _whole(text: str) -> int:
    return _whole_at_least(text, 0, "a whole number, 0 or more")


def _context(text: str) -> int:
    return _whole_at_least(text, 2, "a context of at least 2 tokens (a prompt token and a reply token)")


def _horizon(text: str) -> int:
    return _whole_at_least(text, 1, f"a whole number of MoE layers from 1 to {MAX_HORIZON}", most=MAX_HORIZON)


def _width(text: str) -> int:
    return _whole_at_least(text, 1, f"a whole number from 1 to {MAX_WIDTH}", most=MAX_WIDTH)


def _whole_at_least(text: str, least: int, expected: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least or (most is not None and value > most):
        raise argparse.ArgumentTypeError(f"{expected}, not {text!r}")
    return value


def add_text_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", type=_path, required=True, help="UTF-8 text; blank lines separate documents")
    parser.add_argument("--chat", action="store_true", help="each document's lines are alternating user/assistant turns")
    parser.add_argument("--max-tokens", type=_positive, help="stop after this many traced tokens")
    parser.add_argument("--continuation", type=_whole, default=48, help="greedy tokens generated after each document")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that runs a model."""
    parser.add_argument("--model", type=_named, default=None, help="local folder or hub id (default: the bundled demo model)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--link-gbps", type=float,
                        help="emulated host-to-device link speed in GB/s (default: 25, or bench's --setup)")
    parser.add_argument("--link-latency-us", type=float, default=10.0, help="emulated per-copy latency in microseconds")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="compute dtype (default: the checkpoint's)")
    parser.add_argument("--context", type=_context, default=DEFAULT_CONTEXT_TOKENS, metavar="TOKENS",
                        help=f"prompt and reply together, at most the model's own limit; the VRAM budget sets aside "
                             f"their KV cache (default {DEFAULT_CONTEXT_TOKENS})")


def add_cache_arguments(parser: argparse.ArgumentParser, policy: str = "lru") -> None:
    """The policy and size of the one cache a command runs with. The commands that trace or
    measure a model default to ``lru``, which runs no predictor."""
    parser.add_argument("--policy", choices=POLICY_NAMES, default=policy, help="expert cache policy (default: %(default)s)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--cache-ratio", type=float,
                      help="share of all routed experts the device's expert cache holds (default, with no --vram-budget: "
                           "all of them; lru, gate and seqmoe without a predictor start it empty and copy each expert in "
                           "when first needed)")
    size.add_argument("--vram-budget", type=float, metavar="GB", help="device memory budget in GiB, all included")


def load_engine(args: argparse.Namespace):
    """The engine for ``--model`` (default: the bundled demo model), its cache not yet configured."""
    from .engine import Engine
    from .loader import load_model

    loaded = load_model(args.model or str(demo_model_dir()), device=args.device, dtype=args.dtype)
    if getattr(args, "chat", False):  # generate, trace, eval-predictor: refused before any work
        loaded.check_chat_template(remedy="drop --chat to send the text as plain text")
    link_gbps = DEFAULT_LINK_GBPS if args.link_gbps is None else args.link_gbps
    return Engine(loaded, link_gbps=link_gbps, link_latency_us=args.link_latency_us, context_tokens=args.context)


def refuse_two_link_speeds(args: argparse.Namespace) -> None:
    """Before the model loads: ``--setup`` and ``--link-gbps`` each set the emulated link's speed."""
    if args.setup is not None and args.link_gbps is not None:
        raise SeqMoEError("give --setup or --link-gbps, not both: a setup sets the link's speed")


def run_generate(args: argparse.Namespace) -> int:
    from .engine import Sampling

    refuse_two_link_speeds(args)
    engine = load_engine(args)
    if args.setup is not None:
        from .bench import match_link

        match_link(engine, args.setup)
    engine.configure(args.policy, cache_ratio=args.cache_ratio, vram_budget_gb=args.vram_budget)
    greedy = args.temperature in (None, 0.0)  # temperature 0: the most likely token, as greedy decoding
    sampling = Sampling(
        max_new_tokens=args.max_new_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    prompt_ids = engine.encode(args.prompt, chat=args.chat)
    printer = None if args.json else _StreamPrinter(engine.loaded.tokenizer)
    result = engine.generate(prompt_ids, sampling, on_token=printer.add if printer else None)
    note, predictor = (predictor_note(engine), predictor_file(engine)) if args.policy == "seqmoe" else (None, None)
    engine.close()
    if args.json:
        payload = {
            "text": result.text,
            "reasoning": result.reasoning,
            "token_ids": result.token_ids,
            "prompt_tokens": result.prompt_tokens,
            "stats": result.stats.as_dict(),
            "predictor": predictor,
        }
        print(json.dumps(payload))
    else:
        print(flush=True)
        print(result.stats.summary(), file=sys.stderr)
        if result.stats.context_full:
            print(f"the reply stopped where the {engine.context_tokens}-token context was full", file=sys.stderr)
    if note is not None:
        # After the reply, so that a refusal or a failure stays the one line it is.
        print(note, file=sys.stderr)
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    from .bench import (
        BUILT_IN_PROMPTS,
        PLOT_SUFFIXES,
        event_stream_overhead,
        format_table,
        match_link,
        plot,
        run_bench,
    )

    policies = policy_list(args.policies, POLICY_NAMES)
    ratios = cache_ratios(args.cache_ratios)
    refuse_two_link_speeds(args)
    if args.max_new_tokens < 2:
        raise SeqMoEError("--max-new-tokens must be at least 2: decode speed is timed from the second token on")
    texts, blank = read_prompts(args.prompts) if args.prompts else (BUILT_IN_PROMPTS, 0)
    if args.plot:  # checked before a run of minutes, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SeqMoEError("--plot needs matplotlib: pip install matplotlib (or the package's [bench] extra)") from None
        check_output(args.plot, "--plot", suffixes=PLOT_SUFFIXES)
    engine = load_engine(args)
    if args.setup is not None and engine.link != "emulated":
        raise SeqMoEError(f"only an emulated link can be matched to a setup; this engine copies over {engine.link}: "
                          "drop --setup, or emulate the link with --device cpu")
    chat = engine.loaded.has_chat_template
    prompts = [engine.encode(text, chat=chat) for text in texts]
    for number, ids in enumerate(prompts, 1):
        try:
            engine.reply_room(ids)
        except SeqMoEError as error:
            raise SeqMoEError(f"prompt {number}: {error}") from None
    copy_layers = None
    if engine.link == "emulated" and args.link_gbps is None:
        setup_name = args.setup or DEFAULT_SETUP
        setup = SETUPS[setup_name]
        copy_layers = setup.transfer_to_compute
        link_note = (f"emulated link set before every run so that one expert's bytes take {copy_layers:.2f} x one MoE "
                     f"layer's decode compute of full, measured just before each prompt's run, as for {setup.description}")
        if engine.loaded.host.packed:
            link_note += f"; packed losslessly, a copy moves {engine.loaded.host.packed_share:.1%} of them"
        if args.event_overhead:  # measured before the bench, which sets the link for each of its own runs
            match_link(engine, setup_name, prompts, args.max_new_tokens)
    else:
        link_note = f"{engine.link} link" + (f" {engine.link_gbps} GB/s" if engine.link == "emulated" else "")
    overhead = event_stream_overhead(engine, prompts, ratios[0], args.max_new_tokens) if args.event_overhead else None
    result = run_bench(engine, prompts, policies, ratios, args.max_new_tokens, copy_layers)
    rows = result.rows
    title = f"{engine.loaded.architecture}, {len(prompts)} prompts x {args.max_new_tokens} tokens; {link_note}"
    if result.cut:
        title += (f"\nthe {engine.context_tokens}-token context cut replies short: "
                  + ", ".join(f"prompt {number} at {tokens} tokens" for number, tokens in result.cut))
    if not chat:
        title += f"\n{engine.loaded.name} has no chat template: the prompts went to it as plain text"
    title += ("\neach prompt starts with the cache as configure fills it: under seqmoe with the experts its "
              "predictor's routing frequencies rank first, under the oracle with those the run uses first, "
              "empty under lru and gate")
    if "seqmoe" in policies:
        title += f"\n{predictor_note(engine)}"
    report = {
        "model": engine.loaded.name,
        "link": link_note,
        "predictor": predictor_file(engine) if "seqmoe" in policies else None,
        "rows": [row.as_dict() for row in rows],
        "bounds": [bound.as_dict() for bound in result.bounds],
        "context_cut": [{"prompt": number, "tokens": tokens} for number, tokens in result.cut],
    }
    if overhead is not None:
        report["event_stream"] = overhead
    if args.json:
        print(json.dumps(report))
    out = sys.stderr if args.json else sys.stdout
    print(title, file=out)
    if blank:
        print(f"{blank} blank line{'s' if blank > 1 else ''} of {args.prompts} skipped: one prompt a line", file=out)
    print(format_table(rows), file=out)
    for bound in result.bounds:
        print(bound.summary, file=out)
    if overhead is not None:
        print(
            f"event stream: {overhead['tokens_per_s_with_listener']:.2f} tok/s with a listener, "
            f"{overhead['tokens_per_s_without_listener']:.2f} without ({overhead['overhead']:+.1%}), "
            f"{overhead['events_per_token']:.1f} events per token",
            file=out,
        )
    if args.plot:
        plot(rows, result.bounds, args.plot, title)
    if not all(row.same_tokens for row in rows):
        print("seqmoe: error: a policy generated other tokens than full", file=sys.stderr)
        return 1
    return 0


def predictor_note(engine: Engine) -> str:
    """Which forecaster the ``seqmoe`` policy runs with: a trained predictor, or the router fallback."""
    path = predictor_file(engine)
    if path is not None:
        return f"seqmoe forecasts with the predictor {path}"
    return (f"seqmoe has no calibrated predictor for {engine.loaded.name} and loads the next layer's "
            f"top-k from its router, as gate does; `seqmoe calibrate --model {engine.loaded.path}` trains one")


def predictor_file(engine: Engine) -> str | None:
    """The predictor file the ``seqmoe`` policy forecasts with; ``None`` for the router fallback."""
    return str(engine.predictor_path) if engine.predictor() is not None else None


def policy_list(text: str, known: Sequence[str]) -> list[str]:
    """The comma-separated ``--policies``, each one of ``known``, each once, in the order given."""
    policies = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in policies if p not in known]
    if unknown or not policies:
        what = f"unknown policy {unknown[0]!r}" if unknown else f"--policies names no policy ({text!r})"
        raise SeqMoEError(f"{what}; choose from {', '.join(known)}")
    return policies


def cache_ratios(text: str) -> list[float]:
    """The comma-separated ``--cache-ratios``, each a share of all experts: above 0, at most 1;
    each once, in the order given."""
    try:
        ratios = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        ratios = []
    if not ratios or not all(0 < r <= 1 for r in ratios):
        raise SeqMoEError(f"--cache-ratios takes shares of all experts, above 0 and at most 1, comma-separated; got {text!r}")
    return list(dict.fromkeys(ratios))


def read_prompts(path: Path) -> tuple[list[str], int]:
    """One prompt per non-blank line of ``path``, and how many blank lines were skipped. Lines end
    at a newline only (reading turned CRLF into one): ``splitlines`` would also cut a prompt at
    U+2028 and the other separators Unicode has, which a prompt may hold."""
    text = read_text(path, "the prompts file ")
    lines = text.removesuffix("\n").split("\n")
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise SeqMoEError(f"the prompts file {path} holds no prompts (one per line)")
    return prompts, len(lines) - len(prompts)


def traced_routers(model: str | None, identity: dict[str, object]) -> list[RouterLogits]:
    """The routers of the model the traces were recorded with (loaded, never run)."""
    from .loader import load_model
    from .predictor.model import same_model
    from .routers import router_logits
    from .trace import model_identity

    loaded = load_model(model or str(demo_model_dir()), device="cpu")
    traced = model_identity(loaded)
    if traced["name"] != identity.get("name"):
        raise SeqMoEError(f"the traces are of {identity.get('name')}, not of {loaded.name}: "
                          "give the traced model with --model")
    if not same_model(traced, identity):
        raise SeqMoEError(f"the traces are of another model named {loaded.name}: the config or router weights "
                          f"of {loaded.path} differ from the traced model's; give the traced model with --model")
    return router_logits(loaded)


def run_simulate(args: argparse.Namespace) -> int:
    from .predictor.calibration import find_predictor_for
    from .predictor.model import load_predictor
    from .simulate import cache_slots, copy_bound, require_decode_tokens, simulate
    from .trace import read_traces

    if args.profile not in HARDWARE:
        raise SeqMoEError(f"unknown profile {args.profile!r}; profiles: {', '.join(HARDWARE)}")
    if args.shape not in SHAPES:
        raise SeqMoEError(f"unknown shape {args.shape!r}; shapes: {', '.join(SHAPES)}")
    if not 0 < args.compute_efficiency <= 1:
        raise SeqMoEError("--compute-efficiency is a share of the memory bandwidth: above 0, at most 1")
    if not 0 < args.packed_share <= 1:
        raise SeqMoEError("--packed-share is the share of an expert's bytes a copy moves: above 0, at most 1")
    ratios = cache_ratios(args.cache_ratios)
    policies = policy_list(args.policies, SIMULATED_POLICIES)
    traces = read_traces(args.traces)
    require_decode_tokens(traces)
    for ratio in ratios:  # each refused before the replays of the others, not after
        cache_slots(traces, ratio)
    predictor = None
    if "seqmoe" in policies:
        path = args.predictor or find_predictor_for(traces.manifest["model"])
        if path is not None:
            predictor = load_predictor(path, traces.manifest["model"])
        else:
            print(f"no predictor for {traces.manifest['model'].get('name')}: seqmoe is replayed as the engine runs it "
                  "until one is calibrated, loading the next layer's top-k from its router (`seqmoe calibrate` "
                  "trains one, or give --predictor FILE)", file=sys.stderr)
    needs_routers = "gate" in policies or ("seqmoe" in policies and predictor is None)
    routers = traced_routers(args.model, traces.manifest["model"]) if needs_routers else None
    hardware = HARDWARE[args.profile].at_efficiency(args.compute_efficiency)
    shape = SHAPES[args.shape].packed(args.packed_share)
    try:
        rows = [simulate(traces, policy, ratio, hardware, shape, predictor, routers).as_dict()
                for ratio in ratios for policy in policies]
    except ValueError as error:
        raise SeqMoEError(str(error)) from None
    for row in rows:  # as bench's JSON names it: expert copies per decode token
        row["decode_copies_per_token"] = row["h2d_bytes_per_token"] / shape.copy_bytes
    bounds = [copy_bound(traces, ratio, hardware, shape) for ratio in ratios]
    if args.json:
        print(json.dumps({"profile": args.profile, "shape": args.shape, "rows": rows, "bounds": [b.as_dict() for b in bounds]}))
    out = sys.stderr if args.json else sys.stdout
    print(f"{hardware.description}; {shape.description}; {rows[0]['tokens']} decode tokens of {args.traces}", file=out)
    print(f"{'policy':<12}{'ratio':>7}{'vs full':>9}{'hit rate':>10}{'stall ms/tok':>14}{'copies/tok':>12}{'unused pf':>11}{'prefill vs full':>17}", file=out)
    for row in rows:
        print(f"{row['policy']:<12}{row['cache_ratio']:>7.2f}{row['ratio_to_full']:>9.1%}{row['hit_rate']:>10.1%}"
              f"{1000 * row['stall_seconds_per_token']:>14.3f}{row['decode_copies_per_token']:>12.2f}"
              f"{row['unused_prefetch_fraction']:>11.1%}{row['prefill_ratio_to_full']:>17.1%}", file=out)
    for bound in bounds:
        print(bound.summary, file=out)
    return 0


class _StreamPrinter:
    """Prints a reply's answer as its tokens arrive (``ReplyText``: not a reasoning model's analysis)."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.reply = ReplyText(tokenizer)
        self.printed = 0

    def add(self, token_id: int) -> None:
        self.reply.add(token_id)
        text = self.reply.text()
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def with_engine(command):
    """A command that runs on the model of ``--model``, its cache configured by the flags."""

    def run(args: argparse.Namespace) -> int:
        engine = load_engine(args)
        engine.configure(args.policy, cache_ratio=args.cache_ratio, vram_budget_gb=args.vram_budget)
        try:
            return command(engine, args)
        finally:
            engine.close()

    return run


def run_predictor_command(args: argparse.Namespace) -> int:
    from .predictor import commands

    if args.command == "train-predictor":
        return commands.run_train(args)
    if args.command == "trace":  # before the model loads
        from .trace import check_trace_folder

        if args.every_turn and not args.chat:
            raise SeqMoEError("--every-turn needs --chat: it traces a conversation once per user turn")
        check_trace_folder(args.out)
    runner = {"trace": commands.run_trace, "eval-predictor": commands.run_eval, "calibrate": commands.run_calibrate}
    return with_engine(runner[args.command])(args)


COMMANDS = {
    "generate": run_generate,
    "bench": run_bench_command,
    "trace": run_predictor_command,
    "train-predictor": run_predictor_command,
    "eval-predictor": run_predictor_command,
    "calibrate": run_predictor_command,
    "simulate": run_simulate,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    try:
        with stop_signals_raise():
            return COMMANDS[args.command](args)
    except SeqMoEError as error:
        print(f"seqmoe: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C: what the command writes is cleaned up on the way out
        print("seqmoe: interrupted", file=sys.stderr)
        return 130
    except Terminated as stopped:  # as Ctrl+C, with the status a shell gives a process the signal ended
        print(f"seqmoe: stopped by {stopped.name}", file=sys.stderr)
        return stopped.exit_status


if __name__ == "__main__":
    sys.exit(main())
