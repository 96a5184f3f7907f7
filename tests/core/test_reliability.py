"""Forecast probabilities corrected by how often such forecasts came true."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seqmoe.reliability import MEMORY, Reliability


def scored(raw: float, used_share: float, count: int, reliability: Reliability | None = None) -> Reliability:
    reliability = reliability or Reliability()
    reliability.score(np.full(count, raw), range(round(used_share * count)))
    return reliability


def test_a_probability_stands_until_forecasts_like_it_were_scored() -> None:
    raw = np.array([0.0, 0.03, 0.15, 0.5, 0.97, 1.0])
    assert np.array_equal(Reliability()(raw), raw)
    # Forecasts of another bin say nothing about these.
    assert np.array_equal(scored(0.6, 1.0, 500)(raw), raw)


def test_forecasts_used_more_often_than_they_said_are_raised_keeping_their_order() -> None:
    # The router's softmax share of a top-2 choice: said 0.15, chosen 60% of the time.
    reliability = scored(0.15, 0.6, 2000)
    low, high = reliability(np.array([0.16, 0.19]))
    assert 0.55 < low < high < 0.65
    # Said 0.8, used 40% of the time: lowered.
    assert scored(0.8, 0.4, 2000)(np.array([0.8]))[0] == pytest.approx(0.4, abs=0.02)


def test_a_few_scored_forecasts_move_a_probability_a_little() -> None:
    few, many = scored(0.15, 0.6, 20)(np.array([0.15]))[0], scored(0.15, 0.6, 2000)(np.array([0.15]))[0]
    assert 0.15 < few < 0.3 < many


def test_a_bin_follows_forecasts_that_turn_out_otherwise_later() -> None:
    # Read after every 100 forecasts, as the engine corrects a forecast every few layers.
    reliability = Reliability()
    for _ in range(100):
        scored(0.5, 0.0, 100, reliability)(np.array([0.5]))  # 10,000 forecasts of 0.5, none used
    assert reliability.forecasts.max() <= MEMORY + 100
    for _ in range(100):
        scored(0.5, 1.0, 100, reliability)(np.array([0.5]))  # then as many, all used
    assert reliability(np.array([0.5]))[0] > 0.8


def test_forecasts_scored_since_the_last_correction_count_when_it_comes() -> None:
    reliability = Reliability()
    for layer in range(40):
        reliability.score(np.array([0.15, 0.15, 0.05]), [0, 1] if layer % 2 else [0])
    # 80 forecasts of 0.15, three quarters used; 40 of 0.05, none.
    assert reliability.forecasts[[5, 3]].tolist() == [80, 40] and reliability.used[5] == 60
    corrected = reliability(np.array([0.15, 0.05]))
    assert corrected[0] == pytest.approx(0.15 + 80 * 0.6 / 130) and corrected[1] == pytest.approx(0.05 - 2 / 90)


def test_an_infinite_prior_never_corrects() -> None:
    raw = np.array([0.15])
    assert scored(0.15, 1.0, 1000, Reliability(prior=math.inf))(raw) == raw
