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
at most ``MEMORY`` forecasts' worth of counts, so it follows a conversation that drifts (it
forgets once per pass that counts, below: a few layers' forecasts, far fewer than ``MEMORY``).

A forecast is scored at every decode layer and corrected only when the predictor runs (every
few layers): the routings scored meanwhile wait in a list and are counted in one pass when the
counts are next read. Counted at every layer, the dozen array operations on bins of a few
entries each cost 40 µs a layer in place on the demo (their memory cold after the layer's
compute), 0.3 ms of a 13 ms decode token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EDGES = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
"""Left edges of the bins of raw probability; the last bin reaches 1."""
PRIOR = 50.0
MEMORY = 5000.0


class Reliability:
    def __init__(self, prior: float = PRIOR) -> None:
        self.prior = prior
        """How many scored forecasts weigh as much as the raw probability (``math.inf``: never corrected)."""
        self._forecasts = np.zeros(len(EDGES))
        self._used = np.zeros(len(EDGES))
        self._said = np.zeros(len(EDGES))
        self._pending: list[tuple[np.ndarray, Sequence[int]]] = []
        """Forecasts scored since the counts were last read: (raw probabilities, experts used)."""

    @property
    def forecasts(self) -> np.ndarray:
        """Per bin: the forecasts scored (decayed beyond ``MEMORY``)."""
        return self._counted()[0]

    @property
    def used(self) -> np.ndarray:
        """Per bin: how many of them were used."""
        return self._counted()[1]

    @property
    def said(self) -> np.ndarray:
        """Per bin: the sum of their raw probabilities."""
        return self._counted()[2]

    def score(self, raw: np.ndarray, used: Sequence[int]) -> None:
        """Record one forecast per entry of ``raw`` (its raw probability), of which the entries at
        the indices ``used`` came true."""
        self._pending.append((raw, used))

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """The probabilities ``raw`` as the forecasts scored so far say they turn out."""
        forecasts, used, said = self._counted()
        bins = np.searchsorted(EDGES, raw, side="right") - 1
        error = (used - said) / (forecasts + self.prior)
        return np.clip(raw + error[bins], 0.0, 1.0)

    def _counted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._pending:
            self._count(self._pending)
            self._pending = []
        return self._forecasts, self._used, self._said

    def _count(self, pending: list[tuple[np.ndarray, Sequence[int]]]) -> None:
        raw = np.concatenate([r.ravel() for r, _ in pending])
        came_true = np.zeros(raw.size)
        offset = 0
        for r, used in pending:
            came_true[[offset + i for i in used]] = 1.0
            offset += r.size
        bins = np.searchsorted(EDGES, raw, side="right") - 1
        self._forecasts += np.bincount(bins, minlength=len(EDGES))
        self._used += np.bincount(bins, weights=came_true, minlength=len(EDGES))
        self._said += np.bincount(bins, weights=raw, minlength=len(EDGES))
        full = self._forecasts > MEMORY
        if full.any():
            keep = np.where(full, MEMORY / np.maximum(self._forecasts, 1.0), 1.0)
            self._forecasts *= keep
            self._used *= keep
            self._said *= keep
