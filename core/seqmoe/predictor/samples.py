"""Training and evaluation samples drawn from routing traces.

A trace of ``T`` tokens and ``L`` MoE layers is read as one sequence of ``T * L``
*positions* in execution order (token-major): position ``p = t * L + l``. The forecast
made at ``p`` for horizon ``h`` targets position ``p + h``, which is layer ``l + h`` of the
same token or, past the last layer, a layer of the next token. A target is valid only
inside the same document.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SeqMoEError
from ..trace import Traces


@dataclass
class Positions:
    """Flattened trace tensors and the forecast targets of every position."""

    hidden: torch.Tensor
    """``[P, hidden]`` float16."""
    layer: torch.Tensor
    """``[P]`` the MoE layer of each position."""
    experts: torch.Tensor
    """``[P, k]`` the experts chosen at each position."""
    document: torch.Tensor
    """``[P]`` the document of each position."""
    target: torch.Tensor
    """``[P, H]`` the position each horizon targets, or -1 where it leaves the document."""
    num_layers: int
    num_experts: int

    @property
    def horizon(self) -> int:
        return self.target.shape[1]

    def subset(self, documents: set[int]) -> torch.Tensor:
        """Positions whose document is in ``documents``."""
        mask = torch.isin(self.document, torch.tensor(sorted(documents), dtype=self.document.dtype))
        return mask.nonzero().squeeze(1)

    def multi_hot(self, positions: torch.Tensor) -> torch.Tensor:
        """``[n, H, E]`` 1 where the expert is used at the targeted position (zeros where invalid)."""
        target = self.target[positions]
        chosen = self.experts[target.clamp(min=0).reshape(-1)].long()
        hot = torch.zeros(chosen.shape[0], self.num_experts)
        hot.scatter_(1, chosen, 1.0)
        hot = hot.view(*target.shape, self.num_experts)
        return hot * (target >= 0).unsqueeze(-1)

    def frequency(self, positions: torch.Tensor) -> torch.Tensor:
        """``[L, E]`` each expert's share of its layer's routed tokens among ``positions``."""
        counts = torch.zeros(self.num_layers, self.num_experts)
        experts = self.experts[positions].long()
        layers = self.layer[positions].unsqueeze(1).expand_as(experts)
        counts.index_put_((layers.reshape(-1), experts.reshape(-1)), torch.ones(experts.numel()), accumulate=True)
        return counts / counts.sum(dim=1, keepdim=True).clamp(min=1)


def positions_of(traces: Traces, horizon: int) -> Positions:
    tokens, layers, _ = traces.hidden.shape
    count = tokens * layers
    index = torch.arange(count)
    document = traces.document.long().repeat_interleave(layers)
    target = index.unsqueeze(1) + torch.arange(1, horizon + 1)
    inside = target < count
    same = torch.zeros_like(inside)
    same[inside] = document[target[inside]] == document.unsqueeze(1).expand_as(target)[inside]
    return Positions(
        hidden=traces.hidden.reshape(count, -1),
        layer=index % layers,
        experts=traces.experts.reshape(count, -1),
        document=document,
        target=torch.where(same, target, -1),
        num_layers=layers,
        num_experts=traces.probs.shape[-1],
    )


def split_documents(
    documents: torch.Tensor, paragraphs: torch.Tensor | None = None, every: int = 10
) -> tuple[set[int], set[int]]:
    """(training, validation) documents: those of every ``every``-th paragraph are held out (of at
    least one). A conversation traced at every turn gives documents that begin alike, so they
    stay on one side: else validation would score text seen in training."""
    groups = paragraphs if paragraphs is not None else documents
    group_of = dict(zip(documents.tolist(), groups.tolist()))
    ids = sorted(set(group_of.values()))
    held_groups = {g for i, g in enumerate(ids) if i % every == every - 1} or {ids[-1]}
    held = {d for d, g in group_of.items() if g in held_groups}
    train = set(group_of) - held
    if not train:
        raise SeqMoEError(
            "the traces hold a single document or conversation; training needs two or more (in a text, "
            "separated by a blank line), one of them held out to validate on"
        )
    return train, held
