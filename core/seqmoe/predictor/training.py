"""Training the predictor on routing traces, with validation by document and early stopping."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from ..trace import Traces
from .model import ExpertPredictor, PredictorConfig
from .reuse import REUSE_HORIZONS, reuse_samples, train_reuse
from .samples import Positions, positions_of, split_documents


@dataclass
class TrainingOptions:
    horizon: int = 8
    epochs: int = 15
    batch_size: int = 1024
    learning_rate: float = 3e-3
    patience: int = 3
    width: int = 192
    seed: int = 0
    reuse: bool = True
    """Also train the reuse head (kept only if it beats the rate rule on the validation documents)."""
    reuse_epochs: int = 40


EpochCallback = Callable[[int, float, float], None]
"""Told (epoch, training loss, validation loss) after each epoch; it may raise to cancel."""
ReuseEpochCallback = Callable[[int, float], None]
"""Told (epoch, validation loss) after each epoch of the reuse head; it may raise to cancel."""


def loss_on(predictor: ExpertPredictor, positions: Positions, batch: torch.Tensor) -> torch.Tensor:
    logits = predictor(positions.hidden[batch].float(), positions.layer[batch], positions.experts[batch])
    targets = positions.multi_hot(batch)
    valid = (positions.target[batch] >= 0).unsqueeze(-1).expand_as(targets).float()
    loss = F.binary_cross_entropy_with_logits(logits, targets, weight=valid, reduction="sum")
    return loss / valid.sum().clamp(min=1)


@torch.no_grad()
def validation_loss(predictor: ExpertPredictor, positions: Positions, held: torch.Tensor, batch_size: int) -> float:
    predictor.eval()
    total, count = 0.0, 0
    for start in range(0, held.numel(), 4 * batch_size):
        batch = held[start : start + 4 * batch_size]
        total += loss_on(predictor, positions, batch).item() * batch.numel()
        count += batch.numel()
    return total / max(count, 1)


def train_predictor(
    traces: Traces,
    options: TrainingOptions,
    on_epoch: EpochCallback | None = None,
    progress: bool = True,
    on_reuse_epoch: ReuseEpochCallback | None = None,
) -> ExpertPredictor:
    """A predictor trained on ``traces``; the epoch with the lowest validation loss is kept."""
    torch.manual_seed(options.seed)
    positions = positions_of(traces, options.horizon)
    train_docs, held_docs = split_documents(traces.document, traces.paragraph)
    train, held = positions.subset(train_docs), positions.subset(held_docs)
    manifest = traces.manifest
    config = PredictorConfig(
        hidden_size=positions.hidden.shape[1],
        num_layers=positions.num_layers,
        num_experts=positions.num_experts,
        top_k=positions.experts.shape[1],
        horizon=options.horizon,
        width=options.width,
        model=dict(manifest["model"]),
        frequency=positions.frequency(train).tolist(),
        reuse_horizons=list(REUSE_HORIZONS) if options.reuse else [],
    )
    predictor = ExpertPredictor(config)
    steps_per_epoch = math.ceil(train.numel() / options.batch_size)
    forecaster = [p for name, p in predictor.named_parameters() if not name.startswith("reuse.")]
    optimizer = torch.optim.AdamW(forecaster, lr=options.learning_rate, weight_decay=0.01)
    total_steps = options.epochs * steps_per_epoch
    # One-cycle warm-up over a tenth of the steps, but ending after the first step and before the
    # last (OneCycleLR divides by zero when it ends at step 0); too few steps for that: constant.
    schedule = (
        torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=options.learning_rate, total_steps=total_steps, pct_start=min(0.5, max(0.1, 2 / total_steps))
        )
        if total_steps >= 4
        else None
    )
    initial_loss = validation_loss(predictor, positions, held, options.batch_size)
    # The untrained weights stay if no epoch does better (a learning rate far too high).
    best_loss, best_state, best_epoch, stale = initial_loss, copy.deepcopy(predictor.state_dict()), 0, 0
    started = time.perf_counter()
    bar = tqdm(total=total_steps, desc="train-predictor", disable=not progress, unit="step")
    for epoch in range(1, options.epochs + 1):
        predictor.train()
        order = train[torch.randperm(train.numel())]
        running = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * options.batch_size : (step + 1) * options.batch_size]
            loss = loss_on(predictor, positions, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
            running += loss.item()
            bar.update()
        train_loss = running / steps_per_epoch
        val_loss = validation_loss(predictor, positions, held, options.batch_size)
        bar.set_postfix(train=f"{train_loss:.4f}", val=f"{val_loss:.4f}")
        if on_epoch is not None:
            on_epoch(epoch, train_loss, val_loss)
        if val_loss < best_loss:
            best_loss, best_state, best_epoch, stale = val_loss, copy.deepcopy(predictor.state_dict()), epoch, 0
        else:
            stale += 1
            if stale >= options.patience:
                break
    bar.close()
    predictor.load_state_dict(best_state)
    reuse_report = _train_reuse(predictor, traces, train_docs, held_docs, options.reuse_epochs, on_reuse_epoch)
    config.report = {
        "training_tokens": int(traces.tokens),
        "training_positions": int(train.numel()),
        "validation_positions": int(held.numel()),
        "best_epoch": best_epoch,
        "epochs_run": epoch,
        "initial_validation_loss": initial_loss,
        "validation_loss": best_loss,
        "seconds": round(time.perf_counter() - started, 1),
        "parameters": sum(p.numel() for p in predictor.parameters()),
        **reuse_report,
    }
    return predictor.eval()


def _train_reuse(
    predictor: ExpertPredictor,
    traces: Traces,
    train_docs: set[int],
    held_docs: set[int],
    epochs: int,
    on_epoch: ReuseEpochCallback | None,
) -> dict[str, object]:
    """Train the predictor's reuse head; drop it when it does not beat the rate rule it starts
    from on the validation documents (or when the traces hold no decode tokens to learn from)."""
    if predictor.reuse is None:
        return {}
    config = predictor.config
    try:
        samples = reuse_samples(traces, config.prior(), config.reuse_horizons)
    except ValueError as error:
        report: dict[str, object] = {"reuse": f"not trained: {error}"}
    else:
        report = train_reuse(predictor.reuse, samples, train_docs, held_docs, epochs, on_epoch=on_epoch)
        if report["reuse_validation_loss"] < report["reuse_rate_rule_loss"]:
            return report
        report["reuse"] = "dropped: it did not beat the rate rule on the validation documents"
    predictor.reuse = None
    config.reuse_horizons = []
    return report
