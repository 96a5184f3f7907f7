"""What a model's routers answer to fixed random inputs: how a predictor, or traces, know the
routers they were made with in whatever dtype the model is loaded.

Their sha256 (``trace.routers_digest``) is taken in bfloat16, and it still changed with
``--dtype float16``: float16 rounds a bfloat16 checkpoint's smallest weights, and a float32
checkpoint's weights differently from bfloat16, so the model's own predictor was refused as
made for other weights. Where the digests differ, routers whose logits for the same inputs
agree within rounding are the same routers; another training run, a fine-tune of the routers
or another revision moves them far more.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn

from .routers import find_routers

if TYPE_CHECKING:
    from .loader import LoadedModel

PROBES = 2
"""Random hidden states each router answers; a few numbers per expert and layer are kept."""
TOLERANCE = 0.03
"""How far two answers may be apart, in the larger of the two layers' root mean square logits.
Rounding the weights to another 16-bit dtype moves a logit by about 0.1% of it; a router that is a
network of its own computes in the model's dtype, whose rounding of the largest logits (three or
four times the mean) comes to 1-2% of it. Other routers' logits differ by about the mean itself."""


_ANSWERS: weakref.WeakKeyDictionary[nn.Module, list[list[list[float]]]] = weakref.WeakKeyDictionary()


def router_answers(loaded: LoadedModel) -> list[list[list[float]]]:
    """``[layer][probe][expert]`` float32 logits of each MoE layer's router for the same
    ``PROBES`` standard normal hidden states (seeded), whatever the model; once per loaded model
    (an uncalibrated model's engine looks for a predictor at every ``configure``)."""
    answers = _ANSWERS.get(loaded.model)
    if answers is None:
        hidden = loaded.config.get_text_config().hidden_size
        states = torch.randn(PROBES, hidden, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            answers = _ANSWERS[loaded.model] = [router.logits(states).float().cpu().tolist()
                                                for router in find_routers(loaded)]
    return answers


def same_answers(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` (``router_answers`` as read back from JSON) are one set of routers'
    answers; anything else, in either (a damaged or hand-edited file), is not."""
    try:
        first, second = torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return False
    if first.ndim != 3 or first.shape != second.shape or first.numel() == 0:
        return False
    scale = torch.maximum(first.pow(2).mean(dim=(1, 2)), second.pow(2).mean(dim=(1, 2))).sqrt()  # either way round
    apart = (first - second).abs().amax(dim=(1, 2))
    return bool((apart <= TOLERANCE * scale).all())
