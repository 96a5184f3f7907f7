"""Every MoE layer's router is found, whatever module holds it and whatever its forward takes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from seqmoe import load_model
from seqmoe.errors import SeqMoEError
from seqmoe.routers import BlockChoice, LinearRouter, choice_routers, find_routers, router_logits
from seqmoe.trace import RoutingRecorder

from .conftest import FAMILIES, experts_inputs_and_choices

# Routers that choose the top-k of their logits; deepseek_v3 first picks expert groups and
# afmoe adds a learned bias to the choice, so their choice may differ from the logits' top-k;
# longcat_flash hands a skip choice to its experts as a real expert (with weight 0).
PLAIN_TOP_K = sorted(set(FAMILIES) - {"deepseek_v3", "afmoe", "longcat_flash"})


@pytest.mark.parametrize("family", PLAIN_TOP_K)
def test_the_found_router_ranks_the_chosen_experts_first(tiny_models: dict[str, Path], family: str) -> None:
    loaded = load_model(str(tiny_models[family]), device="cpu")
    recorder = RoutingRecorder(loaded)
    with torch.inference_mode():
        loaded.model(input_ids=torch.arange(2, 40).unsqueeze(0))
    record = recorder.take()
    recorder.close()
    k = record["experts"].shape[-1]
    chosen = record["probs"].float().gather(-1, record["experts"].long())
    kth_best = record["probs"].float().topk(k, dim=-1).values[..., -1:]
    assert (chosen >= kth_best - 1e-3).all()


# Gemma 4 hands its experts one norm of the residual stream and its router another, with a
# scale of its own: given the experts' input, as the engine gives it, the look-ahead there is
# the peers' approximation, not the block's choice.
@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"gemma4"}))
def test_the_gate_look_ahead_ranks_first_exactly_the_experts_each_block_chooses(tiny_models: dict[str, Path], family: str) -> None:
    loaded = load_model(str(tiny_models[family]), device="cpu")
    for scores, (hidden, chosen) in zip(router_logits(loaded), experts_inputs_and_choices(loaded, torch.arange(2, 40).tolist()), strict=True):
        for token_scores, token_chosen in zip(scores(hidden), chosen.long(), strict=True):
            # A token may hand one expert twice (LongCat-Flash: a skip choice lands on a chosen expert).
            distinct = set(token_chosen.tolist())
            assert set(token_scores.topk(len(distinct)).indices.tolist()) == distinct


def test_only_a_block_whose_choice_is_not_its_logits_top_k_is_run_for_the_look_ahead(tiny_models: dict[str, Path]) -> None:
    # Running a block costs its router's corrections and perhaps its shared experts; a plain
    # router's look-ahead is one matrix product.
    assert all(isinstance(r, LinearRouter) for r in choice_routers(load_model(str(tiny_models["mixtral"]), device="cpu")))
    for family in ("deepseek_v3", "afmoe", "longcat_flash"):
        assert all(isinstance(r, BlockChoice) for r in choice_routers(load_model(str(tiny_models[family]), device="cpu")))


@pytest.mark.parametrize("family", ["deepseek_v3", "longcat_flash"])
def test_a_block_is_run_for_its_choice_where_its_router_is_not_where_its_experts_are(tiny_models: dict[str, Path], family: str) -> None:
    # On a GPU the experts stay in host memory and everything else moves: a block whose first
    # parameter is an expert's must still be run on its router's device. The experts never run
    # for the choice, so here they move to the meta device in the GPU's place.
    loaded = load_model(str(tiny_models[family]), device="cpu")
    expected = [router(torch.randn(5, loaded.config.hidden_size, generator=torch.Generator().manual_seed(1))) for router in router_logits(loaded)]
    for experts in loaded.experts:
        for module in experts.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=False)
    routers = choice_routers(loaded)
    assert all(isinstance(r, BlockChoice) for r in routers)
    hidden = torch.randn(5, loaded.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for router, scores in zip(routers, expected, strict=True):
        assert torch.equal(router.logits(hidden), scores)


class _Block(nn.Module):
    def __init__(self, rows: list[int], hidden: int = 6) -> None:
        super().__init__()
        self.experts = nn.Linear(hidden, 4 * hidden)
        self.gates = nn.ModuleList(nn.Linear(hidden, r, bias=False) for r in rows)


def _loaded(block: _Block, experts: int = 4, hidden: int = 6) -> SimpleNamespace:
    model = nn.Sequential(block)
    return SimpleNamespace(
        model=model,
        experts=[block.experts],
        config=SimpleNamespace(get_text_config=lambda: SimpleNamespace(hidden_size=hidden)),
        host=SimpleNamespace(layout=SimpleNamespace(num_experts=experts)),
    )


def test_a_router_with_shared_expert_gates_after_the_routed_ones_gives_the_routed_logits() -> None:
    block = _Block([6])
    (router,) = find_routers(_loaded(block))
    hidden = torch.randn(3, 6)
    assert router.module is block.gates[0]
    assert torch.allclose(router.logits(hidden), block.gates[0](hidden)[:, :4])


def test_a_weight_of_exactly_one_row_per_expert_is_preferred_then_the_fewest_rows_beyond() -> None:
    block = _Block([6, 4])
    assert find_routers(_loaded(block))[0].module is block.gates[1]
    block = _Block([16, 6])  # a shared expert's projection beside a router with two shared-expert gates
    assert find_routers(_loaded(block))[0].module is block.gates[1]


class _NetworkGate(nn.Module):
    """A router with a hidden layer wider than twice the experts, and a skip class after them."""

    def __init__(self, hidden: int = 6, experts: int = 4) -> None:
        super().__init__()
        self.down = nn.Linear(hidden, 2 * experts + 1)
        self.out = nn.Linear(2 * experts + 1, experts + 1)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, str]:
        return self.out(self.down(hidden).relu()), "more outputs after the logits"


def test_a_router_that_is_a_network_is_run_whole_not_taken_for_its_first_projection() -> None:
    block = _Block([])
    block.gate = _NetworkGate()
    (router,) = find_routers(_loaded(block))
    hidden = torch.randn(3, 6)
    assert router.module is block.gate
    assert torch.allclose(router.logits(hidden), block.gate(hidden)[0][:, :4])


def test_a_block_without_a_router_is_refused_clearly() -> None:
    with pytest.raises(SeqMoEError, match="cannot find the router"):
        find_routers(_loaded(_Block([3])))
