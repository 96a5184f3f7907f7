"""How well each method forecasts the experts of the next layers.

recall@m at horizon h: over every position p whose target p + h lies in the same
document, the share of the experts actually routed at p + h that are among the method's
m highest-scored experts for that layer, forecast at p. With the router's k distinct
choices as the truth, precision@k (hits among the k predicted / k) has the same value
as recall@k; both are reported because the peers report both.

Methods (all forecast at position p, layer l, for target layer j = (l + h) mod L):

- ``seqmoe``: the trained predictor;
- ``gate``: the router of layer j applied to the hidden state of layer l (speculative
  loading as in mixtral-offloading and Pre-gated MoE);
- ``freq``: layer j's expert frequencies in the predictor's training traces;
- ``prev``: the experts the previous token used at layer j (falling back to ``freq``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..routers import RouterLogits
from .model import ExpertPredictor
from .samples import Positions

Scorer = Callable[[torch.Tensor], torch.Tensor]
"""Scores ``[n, H, E]`` for a batch of positions ``[n]``."""


def hits_at(scores: torch.Tensor, actual: torch.Tensor, m: int) -> torch.Tensor:
    """For each row, how many of ``actual``'s experts are among the ``m`` best ``scores``."""
    best = scores.topk(min(m, scores.shape[-1]), dim=-1).indices
    return (best.unsqueeze(-1) == actual.unsqueeze(-2).long()).any(dim=-2).sum(dim=-1)


def evaluate(positions: Positions, scorers: dict[str, Scorer], batch_size: int = 2048) -> dict[str, object]:
    """Per method and horizon: recall@k, recall@2k and precision@k, over all valid positions."""
    k, horizon = positions.experts.shape[1], positions.horizon
    totals = {name: torch.zeros(2, horizon) for name in scorers}
    valid_counts = torch.zeros(horizon)
    everything = torch.arange(positions.target.shape[0])
    for start in range(0, everything.numel(), batch_size):
        batch = everything[start : start + batch_size]
        target = positions.target[batch]
        valid = target >= 0
        valid_counts += valid.sum(dim=0)
        actual = positions.experts[target.clamp(min=0)]
        for name, scorer in scorers.items():
            scores = scorer(batch).float()
            for row, m in enumerate((k, 2 * k)):
                totals[name][row] += (hits_at(scores, actual, m) * valid).sum(dim=0)
    methods = {}
    for name, total in totals.items():
        recall = (total / (k * valid_counts.clamp(min=1))).tolist()
        methods[name] = {"recall@k": recall[0], "recall@2k": recall[1], "precision@k": recall[0]}
    return {"top_k": k, "horizons": list(range(1, horizon + 1)), "methods": methods}


def predictor_scorer(predictor: ExpertPredictor, positions: Positions) -> Scorer:
    device = next(predictor.parameters()).device

    @torch.inference_mode()
    def score(batch: torch.Tensor) -> torch.Tensor:
        hidden = positions.hidden[batch].to(device, torch.float32)
        return predictor(hidden, positions.layer[batch].to(device), positions.experts[batch].to(device)).cpu()

    return score


def gate_scorer(routers: list[RouterLogits], positions: Positions) -> Scorer:
    @torch.inference_mode()
    def score(batch: torch.Tensor) -> torch.Tensor:
        hidden = positions.hidden[batch]
        layer = positions.layer[batch]
        scores = torch.empty(batch.numel(), positions.horizon, positions.num_experts)
        for h in range(positions.horizon):
            target = (layer + h + 1) % positions.num_layers
            for j in target.unique().tolist():
                rows = (target == j).nonzero().squeeze(1)
                scores[rows, h] = routers[j](hidden[rows]).cpu()
        return scores

    return score


def frequency_scorer(frequency: torch.Tensor, positions: Positions) -> Scorer:
    def score(batch: torch.Tensor) -> torch.Tensor:
        target = (positions.layer[batch].unsqueeze(1) + torch.arange(1, positions.horizon + 1)) % positions.num_layers
        return frequency[target]

    return score


def previous_token_scorer(frequency: torch.Tensor, positions: Positions) -> Scorer:
    layers = positions.num_layers
    horizons = torch.arange(1, positions.horizon + 1)
    # The target layer's last run known when the forecast is made: a token back for a horizon
    # within the token, two for one reaching into the token after next, and so on.
    back = layers * ((horizons + layers - 1) // layers)

    def score(batch: torch.Tensor) -> torch.Tensor:
        target = positions.target[batch]
        target_layer = (positions.layer[batch].unsqueeze(1) + horizons) % layers
        scores = frequency[target_layer] * 1e-3
        previous = target - back
        same_document = positions.document[previous.clamp(min=0)] == positions.document[target.clamp(min=0)]
        known = (target >= 0) & (previous >= 0) & same_document
        chosen = positions.experts[previous.clamp(min=0)].long()
        bonus = torch.zeros_like(scores).scatter_(-1, chosen, 1.0)
        return scores + bonus * known.unsqueeze(-1)

    return score
