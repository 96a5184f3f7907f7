"""Each expert's recent use: what eviction reads beyond the forecast, and what the reuse
forecast (``predictor.reuse``) is trained and run on.

Both are counted in runs of the expert's own layer: one run is one decode token, or one
prefill pass (a chunk when tracing), so the same history is built from a trace for training
as at run time.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    Plain lists of floats: the policy reads single entries at every eviction.
    """

    def __init__(self, prior: torch.Tensor) -> None:
        self.rate: list[list[float]] = prior.clamp(MIN_RATE, 1.0).tolist()
        self.age: list[list[float]] = [[float(AGE_CAP)] * len(row) for row in self.rate]

    def record(self, layer: int, experts: Sequence[int]) -> None:
        """A run of ``layer`` used ``experts``."""
        rate, age = self.rate[layer], self.age[layer]
        for expert in range(len(rate)):
            rate[expert] *= 1.0 - RATE_SMOOTHING
            age[expert] = min(age[expert] + 1.0, AGE_CAP)
        for expert in experts:
            rate[expert] += RATE_SMOOTHING
            age[expert] = 0.0

    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rate, age)``, each ``[L, E]``."""
        return torch.tensor(self.rate), torch.tensor(self.age)
