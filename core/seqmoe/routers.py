"""Each MoE layer's router, as a map from hidden states to one logit per routed expert.

``find_routers`` gives the choice's ranking before any correction (a load-balancing bias,
expert groups): what traces record. Routers differ in everything after their first map
(softmax or sigmoid, biases, even extra arguments to ``forward``), so where that map is a
linear layer it is applied alone (``LinearRouter``). A router that is a network of its own
(ZAYA1: a projection to a narrower width, then an MLP) has no such layer; it is run whole
(``NetworkRouter``).

``choice_routers`` gives what the ``gate`` policy looks ahead with: scores whose top-k is the
block's own choice. Where the logits' top-k is not that choice (DeepSeek-V3 and GLM-4.5 pick
expert groups and add a bias, ERNIE 4.5 and AFMoE add a bias), the MoE block itself is run
on the hidden state until it calls its experts (``BlockChoice``): whatever rule the model's
code follows, the experts it hands them are its choice.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class BlockChoice:
    """A router whose block chooses by more than its top-k: ``logits`` lifts the experts the block
    chooses for each token above the rest, each keeping its logit's gaps to the others chosen."""

    router: LinearRouter | NetworkRouter
    block: nn.Module
    experts: nn.Module
    dtype: torch.dtype
    """The block's activations' dtype (its shared experts take no other)."""
    device: torch.device
    """Where the block's own weights are (``LoadedModel.device``); its experts stay in host memory."""

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., num_experts]`` scores for ``hidden`` ``[..., hidden_size]``, in float32."""
        logits = self.router.logits(hidden)
        chosen = _run_to_choice(self.block, self.experts, hidden.to(self.device, self.dtype))
        if chosen is None:  # the block skipped its experts for this input; its router is all there is
            return logits
        mask = torch.zeros_like(logits, dtype=torch.bool)
        mask.scatter_(-1, chosen.reshape(*logits.shape[:-1], -1).to(logits.device, torch.long), True)
        lowest_chosen = logits.masked_fill(~mask, math.inf).amin(dim=-1, keepdim=True)
        highest_other = logits.masked_fill(mask, -math.inf).amax(dim=-1, keepdim=True)
        return torch.where(mask, logits + (highest_other - lowest_chosen).clamp(min=0) + 1, logits)


Router = LinearRouter | NetworkRouter
RouterLogits = Callable[[torch.Tensor], torch.Tensor]
PROBE_TOKENS = 64
"""Random hidden states a block is tried on to see whether its choice is its logits' top-k."""
_INDEX_KWARGS = ("top_k_index", "router_indices", "selected_experts")


def find_routers(loaded: LoadedModel) -> list[Router]:
    """For each experts module, its router, found beside it in the same MoE block."""
    hidden = loaded.config.get_text_config().hidden_size
    experts = loaded.host.layout.num_experts
    return [_router_beside(block, module, experts, hidden) for block, module in zip(_blocks(loaded), loaded.experts)]


def choice_routers(loaded: LoadedModel) -> list[Router | BlockChoice]:
    """``find_routers``, each in a ``BlockChoice`` where its block's choice for random hidden
    states is not its logits' top-k (a plain router stays: it costs one matrix product)."""
    hidden = loaded.config.get_text_config().hidden_size
    dtype = loaded.model.get_input_embeddings().weight.dtype  # the hidden states' dtype, from the first layer on
    probe = torch.randn(PROBE_TOKENS, hidden, generator=torch.Generator().manual_seed(0)).to(loaded.device, dtype)
    routers: list[Router | BlockChoice] = []
    for block, experts, router in zip(_blocks(loaded), loaded.experts, find_routers(loaded)):
        try:
            chosen = _run_to_choice(block, experts, probe)
        except Exception:  # a block that needs more than hidden states (ZAYA1's router state) keeps its router
            chosen = None
        if chosen is not None and not _same_sets(router.logits(probe), chosen.reshape(PROBE_TOKENS, -1)):
            router = BlockChoice(router, block, experts, dtype, loaded.device)
        routers.append(router)
    return routers


def router_logits(loaded: LoadedModel) -> list[RouterLogits]:
    """Each MoE layer's router as the map the ``gate`` policy applies: hidden states to scores
    whose top-k is the block's choice."""
    return [router.logits for router in choice_routers(loaded)]


def _blocks(loaded: LoadedModel) -> list[nn.Module]:
    """The MoE block of each experts module: the module that holds it."""
    parents = {id(child): parent for parent in loaded.model.modules() for child in parent.children()}
    return [parents[id(module)] for module in loaded.experts]


class _Chosen(Exception):
    """Raised by an experts module's pre-hook to end its block's forward once the block has chosen."""

    def __init__(self, experts: torch.Tensor) -> None:
        super().__init__("the block has chosen its experts")
        self.experts = experts


def chosen_experts(args: tuple, kwargs: dict) -> torch.Tensor:
    """The expert indices among an experts module's call arguments (transformers' experts
    interface: ``(hidden_states, top_k_index, top_k_weights)``, under a few names)."""
    return args[1] if len(args) > 1 else next(kwargs[k] for k in _INDEX_KWARGS if k in kwargs)


@torch.no_grad()
def _run_to_choice(block: nn.Module, experts: nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    """The experts ``block`` chooses for ``hidden`` ``[..., hidden_size]``: its forward runs until
    it calls ``experts``, which never run. ``None``: the block returned without calling them.
    ``hidden`` is on the device of the block's own weights; its first parameter may be an
    expert's, which stays in host memory."""

    def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
        raise _Chosen(chosen_experts(args, kwargs))

    # First among the hooks: a trace recorder's on the same module must not see this call.
    handle = experts.register_forward_pre_hook(stop, with_kwargs=True, prepend=True)
    try:
        block.forward(hidden.reshape(1, -1, hidden.shape[-1]))
    except _Chosen as chosen:
        return chosen.experts
    finally:
        handle.remove()
    return None


def _same_sets(logits: torch.Tensor, chosen: torch.Tensor) -> bool:
    """Whether each row's ``chosen`` experts are the top-k of its ``logits``."""
    top = logits.topk(chosen.shape[-1], dim=-1).indices.sort(dim=-1).values
    return torch.equal(top.cpu(), chosen.long().sort(dim=-1).values.cpu())


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
