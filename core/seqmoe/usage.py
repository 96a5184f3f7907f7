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
    """

    def __init__(self, prior: torch.Tensor) -> None:
        self.rate: np.ndarray = prior.clamp(MIN_RATE, 1.0).double().numpy().copy()
        self.age: np.ndarray = np.full(self.rate.shape, float(AGE_CAP))

    def record(self, layer: int, experts: Sequence[int]) -> None:
        """A run of ``layer`` used ``experts``."""
        rate, age = self.rate[layer], self.age[layer]
        rate *= 1.0 - RATE_SMOOTHING
        np.minimum(age + 1.0, AGE_CAP, out=age)
        rate[list(experts)] += RATE_SMOOTHING
        age[list(experts)] = 0.0

    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rate, age)``, each ``[L, E]``."""
        return torch.from_numpy(self.rate).float(), torch.from_numpy(self.age).float()
