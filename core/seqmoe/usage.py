"""Each expert's recent use: what eviction reads beyond the forecast, and what the reuse
forecast (``predictor.reuse``) is trained and run on.

Both are counted in runs of the expert's own layer: one run is one decode token, or one
prefill pass (a chunk when tracing), so the same history is built from a trace for training
as at run time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

RATE_SMOOTHING = 1 / 32
"""Weight of the newest run in an expert's rate of use. Chosen with the simulator on the
calibration text's traces: memories of 16 to 50 tokens did equally well, 8 tokens 3% worse."""
AGE_CAP = 64
"""Runs since the last use are counted up to this many (and start there: never used)."""
MIN_RATE = 1e-3
"""A rate never starts below this: an expert never seen in training is not certain never to come."""


class UsageHistory:
    """Per (layer, expert): the rate of use per run of its layer, an exponential average over
    about ``1 / RATE_SMOOTHING`` runs that starts from ``prior``, and the runs since its last use.

    NumPy arrays of doubles: eviction ranks every resident expert from them at every layer.
    ``record`` runs at every layer and touches only what it must (one array operation and the
    few experts used, item by item); the ages, read once a token, are worked out when read.
    """

    def __init__(self, prior: torch.Tensor) -> None:
        self.rate: np.ndarray = prior.clamp(MIN_RATE, 1.0).double().numpy().copy()
        self._runs = np.zeros((self.rate.shape[0], 1), dtype=np.int64)
        """Per layer: its runs so far."""
        self._last_run = np.full(self.rate.shape, -AGE_CAP - 1, dtype=np.int64)
        """The run that last used each expert, counted from 0 (never: far enough back to be capped)."""

    @property
    def age(self) -> np.ndarray:
        """``[L, E]``: the runs of each expert's layer since its last use, up to ``AGE_CAP``."""
        return np.minimum(self._runs - 1 - self._last_run, AGE_CAP).astype(np.float64)

    def record(self, layer: int, experts: Sequence[int]) -> None:
        """A run of ``layer`` used ``experts``."""
        rate, last_run = self.rate[layer], self._last_run[layer]
        rate *= 1.0 - RATE_SMOOTHING
        run = int(self._runs[layer, 0])
        for expert in experts:
            rate[expert] += RATE_SMOOTHING
            last_run[expert] = run
        self._runs[layer, 0] = run + 1

    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rate, age)``, each ``[L, E]``."""
        return torch.from_numpy(self.rate).float(), torch.from_numpy(self.age).float()
