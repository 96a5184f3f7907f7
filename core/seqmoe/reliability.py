"""Forecast probabilities made to mean what they say, from the routings that followed them.

The cache decides with a forecast's probability *p* whether a prefetch is worth its copy, and
eviction ranks by it: both assume that of the experts forecast at *p*, a share *p* is used. A
trained predictor comes close on text like its training text (its binary cross-entropy asks
for it), but the router fallback does not: the next layer's router gives a softmax share, not
the chance of being among the top-k chosen. On the demo model with the predictor withheld
(8 held-out prompts, 24 tokens each), forecasts the router gave 0.10-0.20 were used 62% of the
time, and 0.20-0.30 75%, so on a busy link its forecasts never passed the admission rule.

``Reliability`` learns, in bins of the raw probability, how often forecasts were used at the
run of the layer they were made for, and moves each raw probability by its bin's measured
error, weighed by how much the bin has seen against ``PRIOR`` forecasts that trust the raw
value: an unseen bin leaves it as it is, and within a bin the raw order is kept. A bin keeps
at most ``MEMORY`` forecasts' worth of counts, so it follows a conversation that drifts.
"""

from __future__ import annotations

import numpy as np

EDGES = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
"""Left edges of the bins of raw probability; the last bin reaches 1."""
PRIOR = 50.0
MEMORY = 5000.0


class Reliability:
    def __init__(self, prior: float = PRIOR) -> None:
        self.prior = prior
        """How many scored forecasts weigh as much as the raw probability (``math.inf``: never corrected)."""
        self.forecasts = np.zeros(len(EDGES))
        """Per bin: the forecasts scored (decayed beyond ``MEMORY``)."""
        self.used = np.zeros(len(EDGES))
        """Per bin: how many of them were used."""
        self.said = np.zeros(len(EDGES))
        """Per bin: the sum of their raw probabilities."""

    def score(self, raw: np.ndarray, used: np.ndarray) -> None:
        """Record forecasts of raw probabilities ``raw`` and whether each was used (bools, same shape)."""
        bins = np.searchsorted(EDGES, raw.ravel(), side="right") - 1
        self.forecasts += np.bincount(bins, minlength=len(EDGES))
        self.used += np.bincount(bins, weights=used.ravel().astype(float), minlength=len(EDGES))
        self.said += np.bincount(bins, weights=raw.ravel(), minlength=len(EDGES))
        full = self.forecasts > MEMORY
        if full.any():
            keep = np.where(full, MEMORY / np.maximum(self.forecasts, 1.0), 1.0)
            self.forecasts *= keep
            self.used *= keep
            self.said *= keep

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """The probabilities ``raw`` as the forecasts scored so far say they turn out."""
        bins = np.searchsorted(EDGES, raw, side="right") - 1
        error = (self.used - self.said) / (self.forecasts + self.prior)
        return np.clip(raw + error[bins], 0.0, 1.0)
