"""The reuse forecast: its labels, its wait arithmetic, what it learns, and how eviction uses it."""

from __future__ import annotations

import math

import pytest
import torch

from seqmoe.policies import DISCOUNT_TOKENS, LATER_DISCOUNT, SeqMoEPolicy
from seqmoe.predictor.model import ExpertPredictor, PredictorConfig, load_predictor, save_predictor
from seqmoe.predictor.reuse import REUSE_HORIZONS, ReuseHead, evaluate_reuse, expected_wait, reuse_samples, train_reuse
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


def test_an_untrained_head_waits_as_the_rate_rule_does() -> None:
    head = ReuseHead(8, 2, 4, HORIZONS)
    rate = torch.tensor([[0.5, 0.2, 0.05, 0.01], [0.9, 0.3, 0.1, 0.002]])
    waits = head.waits(torch.randn(8), rate, torch.zeros(2, 4))
    # Between 1e-3 and 1 - 1e-3 the rule is 1 / rate; below, the rate is floored at 1e-3.
    assert waits == pytest.approx(1 / rate.clamp(min=1e-3), rel=1e-3)


def test_a_survival_that_stops_falling_waits_longer_than_one_that_keeps_falling() -> None:
    horizons = torch.tensor(HORIZONS, dtype=torch.float32)
    # Both are unlikely in the next run; the first comes back within a few tokens, the second
    # is seen again in 1 of 10 futures and, when not within 16 tokens, not soon.
    soon = torch.tensor([0.9, 0.5, 0.2, 0.05, 0.01])
    never = torch.tensor([0.95, 0.93, 0.92, 0.91, 0.90])
    waits = expected_wait(torch.stack([soon, never]).log(), horizons)
    assert 1 < waits[0] < 4
    assert waits[1] > 100


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
    rate, age = torch.tensor([[0.4, 0.4, 0.1, 0.1]]), torch.tensor([[0.0, 1.0, 6.0, 5.0]])
    waits = head.waits(announce_b, rate, age)[0]
    assert max(waits[2], waits[3]) < min(waits[0], waits[1])


def policy_with_waits(waits: list[list[float]]) -> SeqMoEPolicy:
    layers, experts = 2, 2
    return SeqMoEPolicy(
        lambda hidden, layer, routed: torch.zeros(1, experts),
        layers,
        torch.full((layers, experts), 0.2),
        stride=1,
        reuse=lambda hidden, rate, age: torch.tensor(waits),
    )


def test_eviction_follows_the_reuse_forecast_for_one_token_then_the_rate_again() -> None:
    policy = policy_with_waits([[1.0, 1.0], [2.0, 50.0]])
    policy.observe(0, [0])
    policy.observe(1, [0])
    policy.forecast(1, torch.zeros(4), torch.tensor([0]))
    # The head's wait w in place of 1 / rate: a use after the next run is a geometric wait of mean w.
    g = LATER_DISCOUNT
    for expert, wait in enumerate([2.0, 50.0]):
        p = policy.probability((1, expert))
        value = p + (1 - p) * (g / wait) / (1 - (1 - 1 / wait) * g)
        assert policy.distance((1, expert)) == pytest.approx(2 - 2 * DISCOUNT_TOKENS * math.log(value))  # layer 1 runs again in 2
    assert victim(policy, [(1, 0), (1, 1)]) == (1, 1)
    for layer in (0, 1, 0):  # a prefill began: the forecast no longer speaks for these runs
        policy.observe(layer, [0])
    assert policy.expected_waits()[1, 1] == pytest.approx(1 / policy.recent_rates()[1, 1])
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
    rate = torch.full((2, 4), 0.25)
    assert torch.equal(loaded.reuse.waits(torch.ones(8), rate, rate), with_head.reuse.waits(torch.ones(8), rate, rate))


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
