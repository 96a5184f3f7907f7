"""Calibration: trace a model on the shipped calibration text and train its predictor.

Trained predictors are stored in the user cache folder, named by the model's identity,
and found again automatically; a predictor shipped in ``resources/predictors/`` (the demo
model's) is found the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import platformdirs
import torch

from ..errors import SeqMoEError
from ..loader import LoadedModel
from ..resources import resources_dir
from ..trace import Traces, chat_tokenizer, iter_traces, model_identity, plain_tokenizer, read_documents
from ..user_files import check_output, read_text
from .model import ExpertPredictor, load_predictor, save_predictor
from .training import TrainingOptions, train_predictor

CALIBRATION_TOKENS = 12_000
CONTINUATION_TOKENS = 48


def calibration_text() -> Path:
    return resources_dir() / "calibration" / "chat.txt"


def user_predictor_path(identity: dict[str, object]) -> Path:
    cache = Path(platformdirs.user_cache_dir("seqmoe-chat", appauthor=False))
    return cache / "predictors" / f"{identity['name']}-{str(identity['config_sha256'])[:12]}.safetensors"


def bundled_predictor_paths() -> list[Path]:
    return sorted((resources_dir() / "predictors").glob("*.safetensors"))


def find_predictor(loaded: LoadedModel) -> Path | None:
    """The calibrated (user cache) or bundled predictor made for this model, if any."""
    return find_predictor_for(model_identity(loaded))


def find_predictor_for(identity: dict[str, object]) -> Path | None:
    """The calibrated (user cache) or bundled predictor made for the model of ``identity``, if any."""
    for path in [user_predictor_path(identity), *bundled_predictor_paths()]:
        if path.is_file() and path.with_suffix(".json").is_file():
            try:
                load_predictor(path, identity)
            except Exception:  # a damaged or foreign file is skipped, never fatal
                continue
            return path
    return None


def collect_traces(
    loaded: LoadedModel,
    text: str,
    chat: bool,
    max_tokens: int,
    continuation: int,
    on_tokens: Callable[[int], None] | None = None,
    every_turn: bool = False,
    context: int | None = None,
) -> Traces:
    """Trace ``text`` in memory (see ``trace.iter_traces``, which fits it to ``context``); with
    ``every_turn``, a reply to each user turn of each conversation, in a fixed shuffled order so that
    ``max_tokens`` spans the text."""
    tokenize = chat_tokenizer(loaded) if chat else plain_tokenizer(loaded)
    documents = read_documents(text, tokenize, every_turn and chat)
    if every_turn and chat:
        random.Random(0).shuffle(documents)
    records = list(iter_traces(loaded, documents, continuation, max_tokens, on_tokens, context))
    if not records:
        raise SeqMoEError("the text produced no tokens to trace")
    joined = {key: torch.cat([r[key] for r in records]) for key in records[0]}
    identity = model_identity(loaded)
    manifest = {"model": identity, "layers": identity["moe_layers"], "experts": identity["num_experts"]}
    return Traces(manifest=manifest, **joined)


def calibrate(
    loaded: LoadedModel,
    options: TrainingOptions | None = None,
    on_progress: Callable[[str, float], None] | None = None,
    text: Path | None = None,
    tokens: int = CALIBRATION_TOKENS,
    continuation: int = CONTINUATION_TOKENS,
    context: int | None = None,
) -> tuple[ExpertPredictor, Path]:
    """Trace the calibration text, train a predictor, store it in the user cache; may be cancelled
    by ``on_progress`` raising.

    A chat model replies to every user turn of the text's conversations, up to ``tokens`` traced
    tokens: the reuse forecast learns only from replies, and more of them make a better predictor
    (demo model, simulated at cache ratio 0.45: 29.7% of full after 12,000 tokens, 32.0% after 48,000).
    """
    report = on_progress or (lambda stage, fraction: None)
    path = check_output(user_predictor_path(model_identity(loaded)), "the predictor file")  # before minutes of work
    chat = loaded.has_chat_template
    done = 0

    def traced(count: int) -> None:
        nonlocal done
        done += count
        report(f"Tracing routing ({done} tokens)", 0.5 * min(done / tokens, 1.0))

    source = read_text(text or calibration_text())
    traces = collect_traces(loaded, source, chat, tokens, continuation, traced, every_turn=True, context=context)
    conversations = traces.paragraph if traces.paragraph is not None else traces.document
    if len(set(conversations.tolist())) < 2 and traces.tokens >= tokens:  # the budget, not the text, ran out
        raise SeqMoEError(
            f"the {tokens} tokens asked for end inside the text's first conversation; calibrating holds one "
            "conversation out to validate on, so it needs tokens from two or more: ask for more tokens"
        )
    options = options or TrainingOptions()

    def epoch_done(epoch: int, train_loss: float, val_loss: float) -> None:
        report(f"Training the predictor (epoch {epoch}, validation loss {val_loss:.4f})", 0.5 + 0.4 * epoch / options.epochs)

    def reuse_epoch_done(epoch: int, val_loss: float) -> None:
        report(f"Learning when experts come back (epoch {epoch}, validation loss {val_loss:.4f})",
               0.9 + 0.1 * epoch / options.reuse_epochs)

    predictor = train_predictor(traces, options, on_epoch=epoch_done, progress=False, on_reuse_epoch=reuse_epoch_done)
    save_predictor(predictor, path)
    report("Calibrated", 1.0)
    return predictor, path

