"""Each MoE layer's router, as a map from hidden states to one logit per routed expert.

It is the choice's ranking before any correction (a load-balancing bias, expert groups):
what the ``gate`` policy forecasts with and what traces record. Routers differ in
everything after their first map (softmax or sigmoid, biases, even extra arguments to
``forward``), so where that map is a linear layer it is applied alone (``LinearRouter``).
A router that is a network of its own (ZAYA1: a projection to a narrower width, then an
MLP) has no such layer; it is run whole (``NetworkRouter``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .errors import SeqMoEError

if TYPE_CHECKING:
    from .loader import LoadedModel


@dataclass(frozen=True)
class LinearRouter:
    """A router whose logits are one linear layer of the hidden state."""

    module: nn.Module
    """The module holding the weight; its input is the router's input."""
    weight: nn.Parameter
    """``[rows, hidden]``; the routed experts are the first ``num_experts`` rows."""
    bias: nn.Parameter | None
    num_experts: int

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., num_experts]`` logits for ``hidden`` ``[..., hidden_size]``, in float32."""
        weight, bias = self._float_map
        return F.linear(hidden.to(weight.device, torch.float32), weight, bias)

    @cached_property
    def _float_map(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The routed experts' rows in float32, made once: ``logits`` runs at every layer of every token."""
        weight = self.weight.detach()[: self.num_experts].float()
        bias = None if self.bias is None else self.bias.detach()[: self.num_experts].float()
        return weight, bias


@dataclass(frozen=True)
class NetworkRouter:
    """A router module run whole on ``[1, tokens, hidden]``; its first output holds ``rows``
    logits a token, the routed experts' first (ZAYA1 adds a class for skipping the experts).
    State that the model hands its router from the layer before is not given: the look-ahead
    sees this hidden state only."""

    module: nn.Module
    rows: int
    num_experts: int

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., num_experts]`` logits for ``hidden`` ``[..., hidden_size]``, in float32."""
        # ``forward``, not the module's call: the trace recorder hooks the call.
        output = _first_tensor(self.module.forward(hidden.reshape(1, -1, hidden.shape[-1]).to(self._weight)))
        return output.reshape(-1, self.rows)[:, : self.num_experts].float().reshape(*hidden.shape[:-1], self.num_experts)

    @cached_property
    def _weight(self) -> nn.Parameter:
        """A parameter, for the device and dtype the module's input needs; looked up once."""
        return next(self.module.parameters())


Router = LinearRouter | NetworkRouter
RouterLogits = Callable[[torch.Tensor], torch.Tensor]


def find_routers(loaded: LoadedModel) -> list[Router]:
    """For each experts module, its router, found beside it in the same MoE block."""
    parents = {id(child): parent for parent in loaded.model.modules() for child in parent.children()}
    hidden = loaded.config.get_text_config().hidden_size
    experts = loaded.host.layout.num_experts
    return [_router_beside(parents[id(module)], module, experts, hidden) for module in loaded.experts]


def router_logits(loaded: LoadedModel) -> list[RouterLogits]:
    """Each MoE layer's router as the map the ``gate`` policy applies: hidden states to logits."""
    return [router.logits for router in find_routers(loaded)]


def _router_beside(block: nn.Module, experts_module: nn.Module, experts: int, hidden: int) -> Router:
    """A weight that maps hidden states to one logit per expert, perhaps inside a router module;
    else a module of the block whose output has that many logits."""
    inside_experts = {id(module) for module in experts_module.modules()}
    candidates = []
    for name, module in block.named_modules():
        weight = getattr(module, "weight", None)
        if id(module) in inside_experts or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if weight.shape[1] == hidden and _logit_rows(weight.shape[0], experts):
            # Exactly one row per expert first; else the fewest rows beyond them, as a router that
            # appends its shared experts' gates after the routed ones (Inkling) has, where a
            # shared expert's projection has its hidden width; then the shallowest module.
            candidates.append((weight.shape[0] - experts, name.count("."), module))
    if candidates:
        module = min(candidates, key=lambda c: c[:2])[2]
        bias = getattr(module, "bias", None)
        bias = bias if isinstance(bias, torch.Tensor) and bias.dim() == 1 and bias.shape[0] == module.weight.shape[0] else None
        return LinearRouter(module, module.weight, bias, experts)
    for module in block.children():
        if id(module) not in inside_experts:
            rows = _rows_out(module, hidden)
            if rows is not None and _logit_rows(rows, experts):
                return NetworkRouter(module, rows, experts)
    raise SeqMoEError(f"cannot find the router of {type(block).__name__} (a map from {hidden} inputs to {experts} logits)")


def _logit_rows(rows: int, experts: int) -> bool:
    """Whether ``rows`` outputs can be the logits of ``experts`` routed experts and a few more
    (shared experts' gates, a skip class), not a projection to some other width."""
    return experts <= rows < 2 * experts


@torch.no_grad()
def _rows_out(module: nn.Module, hidden: int) -> int | None:
    """How many outputs a token ``module`` gives, tried on two tokens; ``None``: it takes no
    hidden states alone, or gives no tensor of that size."""
    weight = next(module.parameters(), None)
    if weight is None:
        return None
    try:
        output = _first_tensor(module.forward(torch.zeros(1, 2, hidden, device=weight.device, dtype=weight.dtype)))
    except Exception:  # a module whose forward needs more than hidden states is not the router
        return None
    if output is None or output.numel() % 2:
        return None
    return output.numel() // 2


def _first_tensor(output: object) -> torch.Tensor | None:
    if isinstance(output, tuple) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) else None
