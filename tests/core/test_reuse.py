"""The reuse forecast: its labels, its wait arithmetic, what it learns, and how eviction uses it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from seqmoe.policies import DISCOUNT_TOKENS, LATER_DISCOUNT, SeqMoEPolicy
from seqmoe.predictor.model import ExpertPredictor, PredictorConfig, load_predictor, save_predictor
from seqmoe.predictor.reuse import REUSE_HORIZONS, ReuseHead, evaluate_reuse, later_value, reuse_samples, train_reuse
from seqmoe.predictor.samples import split_documents
from seqmoe.predictor.training import TrainingOptions, train_predictor
from seqmoe.trace import Traces
from seqmoe.usage import AGE_CAP, RATE_SMOOTHING, UsageHistory

from .test_policies import victim

HORIZONS = [1, 2, 4, 8, 16]


def traces_of(experts: torch.Tensor, decode: torch.Tensor, document: torch.Tensor, hidden: torch.Tensor) -> Traces:
    """``experts [T, L, k]``; ``hidden [T, L, H]``."""
    tokens, layers, _ = experts.shape
    num_experts = int(experts.max()) + 1
    probs = torch.zeros(tokens, layers, num_experts)
    return Traces({"model": {}}, hidden.half(), experts.to(torch.int16), probs, document, decode)


def test_an_untrained_head_values_later_uses_as_the_rate_rule_does() -> None:
    head = ReuseHead(8, 2, 4, HORIZONS)
    rate = np.array([[0.5, 0.2, 0.05, 0.01], [0.9, 0.3, 0.1, 0.002]])
    g = LATER_DISCOUNT
    later = head.later_values(torch.randn(8), rate, np.zeros((2, 4)), g)
    # A geometric wait of mean 1 / rate; the rate is floored at 1e-3.
    rate = rate.clip(min=1e-3)
    assert later == pytest.approx(rate * g / (1 - (1 - rate) * g), rel=1e-3)


def test_the_reuse_forecast_of_one_token_is_the_heads_network() -> None:
    torch.manual_seed(0)
    head = ReuseHead(8, 2, 4, HORIZONS, width=16)
    with torch.no_grad():  # every weight away from its start, the norm's scale and shift and the zeroed output too
        for parameter in head.parameters():
            parameter.normal_(0.0, 0.5)
    head.eval()
    rate = np.array([[0.5, 0.2, 0.05, 0.0001], [0.9, 0.3, 0.1, 0.002]])
    age = np.array([[0.0, 1.0, 7.0, AGE_CAP], [0.0, 3.0, 12.0, 40.0]])
    hidden = torch.randn(8)

    def by_network() -> np.ndarray:
        with torch.no_grad():
            logits = head(hidden.unsqueeze(0), torch.from_numpy(rate).float().view(1, -1), torch.from_numpy(age).float().view(1, -1))[0]
        return later_value(-F.softplus(logits).double().numpy(), np.array(HORIZONS, dtype=np.float64), LATER_DISCOUNT).reshape(2, 4)

    assert head.later_values(hidden, rate, age, LATER_DISCOUNT) == pytest.approx(by_network(), rel=1e-5)
    with torch.no_grad():  # weights folded before they changed must not be kept
        head.input_norm.bias.add_(1.0)
        head.out.bias.add_(1.0)
    head.train(False)
    assert head.later_values(hidden, rate, age, LATER_DISCOUNT) == pytest.approx(by_network(), rel=1e-5)


def test_later_value_is_the_discounted_sum_over_the_interpolated_survival() -> None:
    horizons = np.array(HORIZONS, dtype=np.float64)
    g = 0.6
    survival = np.array([0.9, 0.5, 0.2, 0.05, 0.01])
    # S(n) run by run: geometric between the horizons, then at the mean rate from the first to the last.
    runs = {1: 0.9}
    for (a, sa), (b, sb) in zip(zip(HORIZONS, survival), zip(HORIZONS[1:], survival[1:])):
        for n in range(a + 1, b + 1):
            runs[n] = float(sa * (sb / sa) ** ((n - a) / (b - a)))
    mean = float((survival[-1] / survival[0]) ** (1 / 15))
    for n in range(17, 400):
        runs[n] = runs[n - 1] * mean
    # First use at run m + 1 (m further runs after the first) with probability (S(m) - S(m + 1)) / S(1).
    expected = sum(g**m * (runs[m] - runs[m + 1]) / runs[1] for m in range(1, 399))
    assert float(later_value(np.log(survival), horizons, g)) == pytest.approx(expected, rel=1e-9)


def test_an_expert_back_soon_or_never_is_worth_more_than_one_with_its_mean_wait_spread_evenly() -> None:
    horizons = np.array(HORIZONS, dtype=np.float64)
    # Both are unlikely in the next run. The first is back at the second run in half the futures
    # and otherwise not soon; the second comes back at an even rate. Both wait 19 further runs on
    # average (the first's survival continued past 16 runs at its mean rate).
    soon_or_never = np.array([0.9, 0.45, 0.45, 0.45, 0.45])
    even = (1 - 1 / 19) ** horizons
    values = later_value(np.log(np.stack([soon_or_never, even])), horizons, LATER_DISCOUNT)
    assert values[0] > 3 * values[1]
    assert later_value(np.zeros((1, 5)), horizons, LATER_DISCOUNT) == pytest.approx(0.0, abs=1e-6)  # never back


def test_samples_label_the_next_uses_after_each_decode_token() -> None:
    # One layer, two experts, top-1: a prefill chunk of two tokens, then five decode tokens.
    uses = [0, 1, 0, 0, 1, 0, 0]
    experts = torch.tensor(uses).view(7, 1, 1)
    decode = torch.tensor([0, 0, 1, 1, 1, 1, 1])
    samples = reuse_samples(
        traces_of(experts, decode, torch.zeros(7, dtype=torch.long), torch.randn(7, 1, 4)),
        prior=torch.tensor([[0.5, 0.5]]),
        horizons=[1, 2],
    )
    assert samples.used_within.shape == (5, 2, 2)
    # After decode token 2 (expert 0) come tokens 3 (0) and 4 (1).
    assert samples.used_within[0].tolist() == [[1.0, 1.0], [0.0, 1.0]]
    # After the last token nothing is known; one before it, only the next token.
    assert samples.valid[-1].tolist() == [False, False] and samples.valid[-2].tolist() == [True, False]
    # The history the policy would have: the prefill chunk counts as one run using both experts.
    history = UsageHistory(torch.tensor([[0.5, 0.5]]))
    history.record(0, [0, 1])
    history.record(0, [0])
    assert samples.rate[0].tolist() == pytest.approx(history.rate[0])
    assert samples.age[0].tolist() == [0.0, 1.0]


def test_age_counts_runs_since_the_last_use_up_to_its_cap() -> None:
    history = UsageHistory(torch.full((1, 2), 0.5))
    assert history.age[0].tolist() == [AGE_CAP, AGE_CAP]
    history.record(0, [1])
    history.record(0, [0])
    assert history.age[0].tolist() == [0.0, 1.0]
    assert history.rate[0][1] == pytest.approx(0.5 * (1 - RATE_SMOOTHING) ** 2 + RATE_SMOOTHING * (1 - RATE_SMOOTHING))
    for _ in range(AGE_CAP + 5):
        history.record(0, [1])
    assert history.age[0].tolist() == [AGE_CAP, 0.0]


def announced_topics(documents: int = 60, length: int = 40, seed: int = 0) -> Traces:
    """One layer, four experts, top-1. Each document picks topic A (experts 0, 1) or topic B (2, 3)
    at random for every stretch of eight tokens; the hidden state announces the topic of the next
    stretch one token before it begins, which no history of past use can know."""
    generator = torch.Generator().manual_seed(seed)
    experts, hidden, decode, document = [], [], [], []
    for doc in range(documents):
        topic = int(torch.randint(2, (1,), generator=generator))
        upcoming = topic
        for position in range(length):
            topic = upcoming
            if position % 8 == 7:
                upcoming = int(torch.randint(2, (1,), generator=generator))
            experts.append(2 * topic + int(torch.randint(2, (1,), generator=generator)))
            state = torch.randn(4, generator=generator) * 0.1
            state[0] += 1.0 if upcoming else -1.0
            hidden.append(state)
            decode.append(int(position > 0))
            document.append(doc)
    return traces_of(
        torch.tensor(experts).view(-1, 1, 1), torch.tensor(decode), torch.tensor(document), torch.stack(hidden).view(-1, 1, 4)
    )


def test_the_head_learns_what_the_hidden_state_announces() -> None:
    torch.manual_seed(0)
    traces = announced_topics()
    samples = reuse_samples(traces, torch.full((1, 4), 0.5), HORIZONS)
    train, held = split_documents(traces.document)
    head = ReuseHead(4, 1, 4, HORIZONS, width=16)
    untrained = evaluate_reuse(head, samples)
    assert untrained["reuse_loss"] == pytest.approx(untrained["rate_rule_loss"])
    report = train_reuse(head, samples, train, held, epochs=15)
    assert report["reuse_validation_loss"] < 0.8 * report["reuse_rate_rule_loss"]
    # On conversations it never saw, as eval-predictor reports it.
    unseen = evaluate_reuse(head, reuse_samples(announced_topics(documents=10, seed=1), torch.full((1, 4), 0.5), HORIZONS))
    assert unseen["reuse_loss"] < 0.8 * unseen["rate_rule_loss"]
    # Topic B announced: B's experts come back sooner than A's, though A was used last.
    announce_b = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rate, age = np.array([[0.4, 0.4, 0.1, 0.1]]), np.array([[0.0, 1.0, 6.0, 5.0]])
    later = head.later_values(announce_b, rate, age, LATER_DISCOUNT)[0]
    assert min(later[2], later[3]) > max(later[0], later[1])


def policy_with_reuse(values: list[list[float]]) -> SeqMoEPolicy:
    layers, experts = 2, 2
    return SeqMoEPolicy(
        lambda hidden, layer, routed: torch.zeros(1, experts),
        layers,
        torch.full((layers, experts), 0.2),
        stride=1,
        reuse=lambda hidden, rate, age, discount: np.array(values),
    )


def test_eviction_follows_the_reuse_forecast_for_one_token_then_the_rate_again() -> None:
    policy = policy_with_reuse([[0.5, 0.5], [0.4, 0.01]])
    policy.observe(0, [0])
    policy.observe(1, [0])
    policy.forecast(1, torch.zeros(4), torch.tensor([0]))
    # The head's worth of the later uses in place of the rate's.
    for expert, later in enumerate([0.4, 0.01]):
        p = policy.probability((1, expert))
        value = p + (1 - p) * later
        assert policy.distance((1, expert)) == pytest.approx(2 - 2 * DISCOUNT_TOKENS * math.log(value))  # layer 1 runs again in 2
    assert victim(policy, [(1, 0), (1, 1)]) == (1, 1)
    for layer in (0, 1, 0):  # a prefill began: the forecast no longer speaks for these runs
        policy.observe(layer, [0])
    rate = policy.recent_rates()[1, 1]
    assert policy.later_values()[1, 1] == pytest.approx(rate * LATER_DISCOUNT / (1 - (1 - rate) * LATER_DISCOUNT))
    assert victim(policy, [(1, 0), (1, 1)]) == (1, 1)  # now by its lower rate of use


def test_a_predictor_without_a_reuse_head_loads_and_evicts_by_the_rate(tmp_path) -> None:
    predictor = ExpertPredictor(PredictorConfig(hidden_size=8, num_layers=2, num_experts=4, top_k=1, horizon=2, width=8))
    path = tmp_path / "p.safetensors"
    save_predictor(predictor, path)
    assert load_predictor(path).reuse is None
    with_head = ExpertPredictor(
        PredictorConfig(hidden_size=8, num_layers=2, num_experts=4, top_k=1, horizon=2, width=8, reuse_horizons=HORIZONS)
    )
    save_predictor(with_head, path)
    loaded = load_predictor(path)
    rate = np.full((2, 4), 0.25)
    values = [head.later_values(torch.ones(8), rate, rate, LATER_DISCOUNT) for head in (loaded.reuse, with_head.reuse)]
    assert np.array_equal(*values)


def test_training_keeps_the_head_only_when_it_beats_the_rate_rule() -> None:
    options = TrainingOptions(epochs=1, width=8, horizon=1, reuse_epochs=15)
    traces = announced_topics()
    kept = train_predictor(traces, options, progress=False)
    assert kept.reuse is not None and kept.config.reuse_horizons == list(REUSE_HORIZONS)
    report = kept.config.report
    assert report["reuse_validation_loss"] < report["reuse_rate_rule_loss"]
    # Traces of prefill only: nothing to learn reuse during decode from, so no head.
    traces.decode = torch.zeros_like(traces.decode)
    dropped = train_predictor(traces, options, progress=False)
    assert dropped.reuse is None and dropped.config.reuse_horizons == []
    assert dropped.config.report["reuse"].startswith("not trained")
