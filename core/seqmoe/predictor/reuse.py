"""The reuse forecast: how soon each expert will be used again, beyond the next token.

Belady's eviction needs, for every resident expert, the distance to its next use. The
forecaster (``model``) sees one token ahead; beyond it, a rate of use alone treats every
expert as equally likely to come back at each later token (a geometric wait of mean
``1 / rate``). Measured with the simulator, eviction that knows the true next use up to 8
tokens ahead makes a third fewer copies than that; the conversation decides which experts
come back, and the hidden state carries the conversation.

So at the last MoE layer of each decode token, this head reads that layer's input hidden
state and every expert's usage history (``usage.UsageHistory``) and gives, for each expert
and each ``N`` in ``horizons``, the probability that its layer uses it within the next ``N``
runs. Its logits are a learned correction to the geometric ones, ``1 - (1 - rate) ** N``,
with the output layer starting at zero, so an untrained head is the rate rule exactly. It is
factorised per expert (a context vector from the hidden state, an embedding per expert, the
expert's own history), so its size grows with the number of experts, not with its square.

From the probabilities, ``later_values`` gives what the expert's later uses are worth to
eviction now, given the next run does not use it: ``E[g ** N]``, ``N`` the further runs until
its next use (``g`` the policy's discount per token, the value 0 if it never comes back). The
survival ``S(n)`` between the horizons is interpolated geometrically and continued past the
last horizon at its mean rate from the first horizon; for the geometric case the value is
``rate g / (1 - (1 - rate) g)``, the rate rule's. The discount reads the head's whole curve:
an expert likely back within two tokens but otherwise gone is worth more than one with the
same mean wait spread evenly (simulated on the held-out chat at cache ratio 0.45, this gave
37.9% of ``full`` against 37.6% from the curve's mean wait with the same head; 25.7% against
25.6% at 0.30, 56.1% against 55.4% at 0.60; on Shakespeare at 0.45, 36.2% against 36.1%).

Its validation loss is not a measure of the eviction it gives. On the demo model (simulated
on the held-out chat, cache ratio 0.45, when eviction read the head's mean wait), the head cut
decode copies from 5.70 to 5.11 per token against the rate rule; trained on the same traces, a
head of width 128 instead of 64 lowered the validation loss from 0.319 to 0.292 and copied 5.11
against 5.10, and weighting the recently used experts (those eviction chooses among) copied
5.09. Given also each expert's router probability at the token and a running mean of those
probabilities (as two more history features), a head trained on the bundled predictor's traces
lowered the validation loss from 0.310 to 0.305 and copied 4.95 per token either way (37.3% of
``full``). Since eviction reads the whole curve, a better head counts for more: retrained on the
bundled predictor's traces, a head of width 128 (validation loss 0.276 against 0.310) gave 38.4%
of ``full`` on the held-out chat against 37.8% and 37.7% for two heads of width 64 trained the
same way, but 35.9% against 36.0% on Shakespeare, a text unlike the training text; the width
stays 64. Judge a change to the head with ``seqmoe simulate``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..threads import one_cpu_thread
from ..trace import Traces, document_runs
from ..usage import AGE_CAP, UsageHistory

REUSE_HORIZONS = (1, 2, 4, 8, 16)
"""Runs ahead at which the head forecasts use; the first must be 1 (see ``later_value``)."""
HISTORY_FEATURES = 4


class ReuseHead(nn.Module):
    """Per expert and horizon ``N``: the logit that the expert's layer uses it within ``N`` runs."""

    def __init__(self, hidden_size: int, num_layers: int, num_experts: int, horizons: list[int], width: int = 64) -> None:
        super().__init__()
        if list(horizons[:1]) != [1] or len(horizons) < 2 or sorted(set(horizons)) != list(horizons):
            raise ValueError("reuse horizons start at 1 and increase, at least two of them")
        self.shape = (num_layers, num_experts)
        self.register_buffer("horizons", torch.tensor(horizons, dtype=torch.float32), persistent=False)
        self.input_norm = nn.LayerNorm(hidden_size)
        self.context = nn.Linear(hidden_size, width)
        self.expert_embedding = nn.Embedding(num_layers * num_experts, width)
        nn.init.normal_(self.expert_embedding.weight, std=0.02)
        self.history = nn.Linear(HISTORY_FEATURES, width)
        self.hidden_layer = nn.Linear(width, width)
        self.out = nn.Linear(width, len(horizons))
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.horizon_runs = np.array(horizons, dtype=np.float64)
        """``horizons`` again, for ``later_value``'s arithmetic in NumPy after the forward pass."""
        self._folded: _FoldedHead | None = None

    def forward(self, hidden: torch.Tensor, rate: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, L * E, K]`` from hidden states ``[N, hidden]`` and histories ``[N, L * E]``."""
        rate = rate.clamp(1e-3, 1 - 1e-3)
        context = self.context(self.input_norm(hidden.float())).unsqueeze(1)
        state = F.gelu(context + self.expert_embedding.weight + self.history(_history(rate, age)))
        state = state + F.gelu(self.hidden_layer(state))
        return rate_rule_logits(rate, self.horizons) + self.out(state)

    def train(self, mode: bool = True) -> "ReuseHead":
        self._folded = None
        return super().train(mode)

    @torch.inference_mode()
    def later_values(self, hidden: torch.Tensor, rate: np.ndarray, age: np.ndarray, discount: float) -> np.ndarray:
        """``[L, E]`` what each expert's uses after the next run of its layer are worth now,
        ``E[discount ** N]`` (``N`` the further runs until its next use), given that run does not
        use it; for one token, with histories ``[L, E]`` as ``UsageHistory`` holds them.

        The same function as ``forward`` for one token, in a dozen tensor operations with the
        biases and the input norm's scale folded into the weights (``_FoldedHead``): it runs after
        every decode token, and each operation costs more host time than its arithmetic.
        """
        device = self.horizons.device
        folded = self._folded
        if folded is None or folded.out.device != device:
            folded = self._folded = _FoldedHead.of(self)
        with one_cpu_thread(device):
            rate_now = torch.from_numpy(rate).to(device, torch.float32).view(-1).clamp_(1e-3, 1 - 1e-3)
            age_now = torch.from_numpy(age).to(device, torch.float32).view(-1)
            normed = F.layer_norm(hidden.reshape(-1).to(device, torch.float32), self.input_norm.normalized_shape, eps=self.input_norm.eps)
            state = F.gelu(torch.addmm(folded.expert_base + torch.mv(folded.context, normed), _history(rate_now, age_now), folded.history))
            state += F.gelu(F.linear(state, self.hidden_layer.weight, self.hidden_layer.bias))
            logits = torch.addmm(rate_rule_logits(rate_now, self.horizons).add_(self.out.bias), state, folded.out)
            log_survival = -np.logaddexp(0.0, logits.double().cpu().numpy())
        return later_value(log_survival, self.horizon_runs, discount).reshape(self.shape)


def _history(rate: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
    """``[..., HISTORY_FEATURES]`` from clamped rates and ages: scaled to about the unit range of
    the other inputs; "just used" apart, as age 0 is a cliff."""
    return torch.stack([4 * rate, rate.log() / 7, age / AGE_CAP, (age == 0).float()], dim=-1)


@dataclass(frozen=True)
class _FoldedHead:
    """``ReuseHead``'s weights for one token at a time: the input norm's scale and shift and the
    context's bias folded into ``context`` and ``expert_base``, the weights transposed for ``addmm``."""

    context: torch.Tensor
    """``[W, hidden]``: the context layer's weight times the input norm's scale."""
    expert_base: torch.Tensor
    """``[L * E, W]``: each expert's embedding plus the history layer's and the context's biases."""
    history: torch.Tensor
    """``[HISTORY_FEATURES, W]``"""
    out: torch.Tensor
    """``[W, K]``"""

    @classmethod
    @torch.no_grad()
    def of(cls, head: ReuseHead) -> _FoldedHead:
        norm, context = head.input_norm, head.context
        context_bias = context.bias + context.weight @ norm.bias
        expert_base = head.expert_embedding.weight + head.history.bias + context_bias
        return cls(context.weight * norm.weight, expert_base, head.history.weight.t().contiguous(), head.out.weight.t().contiguous())


def rate_rule_logits(rate: torch.Tensor, horizons: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` the rate rule's logits of use within each horizon: ``logit(1 - S)`` with
    ``S = (1 - rate) ** N``, the geometric survival, computed from ``log S``."""
    log_survival = horizons * torch.log1p(-rate.clamp(1e-3, 1 - 1e-3).unsqueeze(-1))
    return torch.log(-torch.expm1(log_survival)) - log_survival


def later_value(log_survival: np.ndarray, horizons: np.ndarray, discount: float) -> np.ndarray:
    """``E[discount ** N]`` from ``log S`` at ``horizons`` (last axis, the first horizon 1),
    ``N >= 1`` the runs after the first until the next use, given the first does not use it.

    By parts, ``E = g - (1 - g) sum_{m>=2} g ** (m - 1) S(m) / S(1)`` with ``g = discount``.
    """
    log_survival = np.minimum.accumulate(log_survival, axis=-1)
    relative = np.exp(log_survival - log_survival[..., :1])  # S(N) / S(1)
    widths = horizons[1:] - horizons[:-1]
    ratio = np.exp((log_survival[..., 1:] - log_survival[..., :-1]) / widths)  # per run, within each interval
    # Run m = N_i + j of the interval after horizon N_i: S(m) / S(1) = relative_i ratio_i ** j.
    total = (relative[..., :-1] * discount ** (horizons[:-1] - 1) * _geometric_sum(discount * ratio, widths)).sum(axis=-1)
    # Past the last horizon, at the mean per-run survival from the first horizon to the last: the
    # last interval alone is noisy.
    mean = np.exp(log_survival[..., -1] - log_survival[..., 0]) ** (1 / (horizons[-1] - horizons[0]))
    tail = discount * mean
    total = total + relative[..., -1] * discount ** (horizons[-1] - 1) * tail / (1 - tail)
    return discount - (1 - discount) * total


def _geometric_sum(ratio: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``sum_{m=1}^{count} ratio ** m``, also where ``ratio`` is 1."""
    flat = np.abs(ratio - 1) < 1e-6
    safe = np.where(flat, 0.0, ratio)
    return np.where(flat, np.broadcast_to(count, ratio.shape), safe * (1 - safe**count) / (1 - safe))


@dataclass
class ReuseSamples:
    """One sample per decode token of a trace: the state after it, and which experts come back."""

    hidden: torch.Tensor
    """``[S, hidden]`` the last MoE layer's input for the token."""
    rate: torch.Tensor
    """``[S, L * E]``"""
    age: torch.Tensor
    """``[S, L * E]``"""
    used_within: torch.Tensor
    """``[S, L * E, K]`` 1 where the expert is used within the next ``N_k`` runs."""
    valid: torch.Tensor
    """``[S, K]`` whether the document lasts ``N_k`` more runs."""
    document: torch.Tensor
    """``[S]``"""


def reuse_samples(traces: Traces, prior: torch.Tensor, horizons: list[int]) -> ReuseSamples:
    """Replay each document's runs (prefill chunks, then decode tokens) through a ``UsageHistory``
    as the engine's policy would, and label every decode token with the experts' next uses."""
    layers, experts = prior.shape
    offsets = (torch.arange(layers) * experts).view(1, layers, 1)
    parts: dict[str, list[torch.Tensor]] = {key: [] for key in ("hidden", "rate", "age", "used_within", "valid", "document")}
    for document, runs in document_runs(traces):
        used = torch.zeros(len(runs), layers * experts)
        history = UsageHistory(prior)
        rates, ages, decode = [], [], []
        for index, run in enumerate(runs):
            chosen = traces.experts[run.tokens].long() + offsets
            used[index, chosen.reshape(-1)] = 1.0
            for layer in range(layers):
                history.record(layer, sorted(set(traces.experts[run.tokens, layer].reshape(-1).tolist())))
            if run.decode:
                rate, age = history.features()
                rates.append(rate.reshape(-1))
                ages.append(age.reshape(-1))
                decode.append(index)
        if not decode:
            continue
        at = torch.tensor(decode)
        before = torch.cat([torch.zeros(1, used.shape[1]), used.cumsum(dim=0)])  # uses in runs < i
        labels, valid = [], []
        for horizon in horizons:
            end = (at + 1 + horizon).clamp(max=len(runs))
            labels.append(before[end] - before[at + 1] > 0)
            valid.append(at + horizon < len(runs))
        last_tokens = torch.tensor([int(runs[i].tokens[-1]) for i in decode])
        parts["hidden"].append(traces.hidden[last_tokens, layers - 1])
        parts["rate"].append(torch.stack(rates))
        parts["age"].append(torch.stack(ages))
        parts["used_within"].append(torch.stack(labels, dim=-1).float())
        parts["valid"].append(torch.stack(valid, dim=-1))
        parts["document"].append(torch.full((len(decode),), document))
    if not parts["hidden"]:
        raise ValueError("the traces hold no decode tokens to learn reuse from")
    return ReuseSamples(**{key: torch.cat(value) for key, value in parts.items()})


def reuse_loss(head: ReuseHead, samples: ReuseSamples, batch: torch.Tensor) -> torch.Tensor:
    return _masked_loss(_head_logits(head, samples)(batch), samples, batch)


def _masked_loss(logits: torch.Tensor, samples: ReuseSamples, batch: torch.Tensor) -> torch.Tensor:
    weight = samples.valid[batch].unsqueeze(1).expand_as(logits).float().to(logits.device)
    targets = samples.used_within[batch].to(logits.device)
    loss = F.binary_cross_entropy_with_logits(logits, targets, weight=weight, reduction="sum")
    return loss / weight.sum().clamp(min=1)


LogitsOf = Callable[[torch.Tensor], torch.Tensor]
"""Logits ``[n, L * E, K]`` for a batch of sample indices."""


def _head_logits(head: ReuseHead, samples: ReuseSamples) -> LogitsOf:
    device = head.horizons.device
    return lambda batch: head(samples.hidden[batch].to(device), samples.rate[batch].to(device), samples.age[batch].to(device))


def _rate_rule_of(samples: ReuseSamples, horizons: torch.Tensor) -> LogitsOf:
    return lambda batch: rate_rule_logits(samples.rate[batch].to(horizons.device), horizons)


@torch.no_grad()
def _mean_loss(logits_of: LogitsOf, samples: ReuseSamples, indices: torch.Tensor, batch_size: int = 256) -> float:
    total = sum(_masked_loss(logits_of(batch), samples, batch).item() * batch.numel() for batch in indices.split(batch_size))
    return total / indices.numel() if indices.numel() else float("nan")


def evaluate_reuse(head: ReuseHead, samples: ReuseSamples) -> dict[str, float | int]:
    """The head's loss on ``samples`` (say, of a held-out text) against the rate rule's."""
    head.eval()
    every = torch.arange(samples.hidden.shape[0])
    return {
        "samples": every.numel(),
        "reuse_loss": _mean_loss(_head_logits(head, samples), samples, every),
        "rate_rule_loss": _mean_loss(_rate_rule_of(samples, head.horizons), samples, every),
    }


def train_reuse(
    head: ReuseHead,
    samples: ReuseSamples,
    train_documents: set[int],
    held_documents: set[int],
    epochs: int = 40,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    patience: int = 3,
    on_epoch: Callable[[int, float], None] | None = None,
) -> dict[str, float | int]:
    """Train ``head`` in place, keeping the epoch with the lowest validation loss; the report
    gives that loss and the rate rule's on the same samples. ``on_epoch`` is told (epoch,
    validation loss) and may raise to cancel."""

    def indices(documents: set[int]) -> torch.Tensor:
        return torch.isin(samples.document, torch.tensor(sorted(documents))).nonzero().squeeze(1)

    train, held = indices(train_documents), indices(held_documents)
    optimizer = torch.optim.AdamW(head.parameters(), lr=learning_rate, weight_decay=0.01)
    logits_of = _head_logits(head, samples)
    rate_rule_loss = _mean_loss(_rate_rule_of(samples, head.horizons), samples, held)
    head.eval()
    best_loss = _mean_loss(logits_of, samples, held)
    best_state, best_epoch, stale = copy.deepcopy(head.state_dict()), 0, 0
    for epoch in range(1, epochs + 1):
        head.train()
        order = train[torch.randperm(train.numel())]
        for start in range(0, order.numel(), batch_size):
            loss = reuse_loss(head, samples, order[start : start + batch_size])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        head.eval()
        loss = _mean_loss(logits_of, samples, held)
        if on_epoch is not None:
            on_epoch(epoch, loss)
        if loss < best_loss:
            best_loss, best_state, best_epoch, stale = loss, copy.deepcopy(head.state_dict()), epoch, 0
        else:
            stale += 1
            if stale >= patience:
                break
    head.load_state_dict(best_state)
    head.eval()
    return {
        "reuse_training_samples": int(train.numel()),
        "reuse_validation_samples": int(held.numel()),
        "reuse_best_epoch": best_epoch,
        "reuse_validation_loss": best_loss,
        "reuse_rate_rule_loss": rate_rule_loss,
    }
