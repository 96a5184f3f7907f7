"""Packed bfloat16 experts: every bit comes back, and about a quarter fewer bytes cross the link."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seqmoe.compression import PackedExpert, RawExpert, pack
from seqmoe.store import HostStore


def unpacked(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    packed = pack(tensors)
    out = [torch.full_like(tensor, float("nan")) for tensor in tensors]
    packed.write_into(out)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3e38, -3e38, 1.0, -2.5, 1e-3]


@pytest.mark.parametrize("size", [1, 2, 7, 4096, 4097])
def test_every_bit_comes_back_whatever_the_length_and_values(size: int) -> None:
    torch.manual_seed(size)
    weights = (torch.randn(size) * 0.02).to(torch.bfloat16)
    weights[: min(size, len(SPECIAL))] = torch.tensor(SPECIAL[:size], dtype=torch.bfloat16)
    wide = (torch.randn(size) * torch.logspace(-30, 30, size)).to(torch.bfloat16)  # exponents far apart
    raw_bits = torch.randint(-(2**15), 2**15, (size,), dtype=torch.int16).view(torch.bfloat16)
    tensors = [weights, wide.view(1, size), raw_bits]
    assert all(same_bits(a, b) for a, b in zip(unpacked(tensors), tensors))


def test_a_slot_of_odd_size_at_an_odd_offset_gets_its_weights_and_no_more() -> None:
    torch.manual_seed(0)
    weights = (torch.randn(7) * 0.02).to(torch.bfloat16)
    weights[-1] = 0.0  # kept whole, at the slot's last position
    pool = torch.full((3, 7), float("nan"), dtype=torch.bfloat16)
    pack([weights]).write_into([pool[1]])
    assert same_bits(pool[1], weights) and pool[0].isnan().all() and pool[2].isnan().all()


@pytest.mark.parametrize("size", [4096, 4097])
def test_exponents_at_the_edges_of_the_window_and_just_outside_it(size: int) -> None:
    """Every exponent in 100..115, evenly: that window holds the most; 99 and 116 are kept whole."""
    torch.manual_seed(size)
    exponents = 100 + torch.arange(size) % 16
    exponents[:4] = torch.tensor([99, 116, 115, 100])  # codes 15 and 0 in a byte's low and high nibble (0, 15 at 16, 15)
    exponents[-1] = 116
    signs = torch.randint(0, 2, (size,)) * -(2**15)
    weights = (signs | exponents << 7 | torch.randint(0, 128, (size,))).to(torch.int16).view(torch.bfloat16)
    packed = pack([weights])
    assert packed.segments[0].base == 100 and packed.segments[0].escapes == 3
    assert same_bits(unpacked([weights])[0], weights)


def test_trained_looking_weights_take_about_three_quarters_of_their_bytes() -> None:
    torch.manual_seed(0)
    tensors = [(torch.randn(256, 128) * 0.02).to(torch.bfloat16), (torch.randn(128, 128) * 0.05).to(torch.bfloat16)]
    packed = pack(tensors)
    raw = sum(t.numel() * 2 for t in tensors)
    assert 0.75 <= packed.nbytes / raw < 0.76
    assert sum(segment.escapes for segment in packed.segments) < 0.001 * raw


class Experts(nn.Module):
    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.num_experts = weights.shape[0]
        self.gate_up_proj = nn.Parameter(weights, requires_grad=False)


def test_experts_that_do_not_pack_well_are_kept_as_they_are() -> None:
    """Random bit patterns have no crowded exponents: packing would cost more than it saves."""
    noise = torch.randint(-(2**15), 2**15, (4, 32, 32), dtype=torch.int16).view(torch.bfloat16)
    modules = [Experts(noise.clone()), Experts(noise.clone())]
    host = HostStore(modules, pinned=None)
    assert not host.packed and host.bytes_per_copy == host.layout.bytes_per_expert
    assert same_bits(host.expert((1, 2)).tensors[0], noise[2])
    assert modules[1].gate_up_proj.data_ptr() == host.expert((1, 0)).tensors[0].data_ptr()  # no second copy


def test_a_layer_that_does_not_pack_well_is_kept_as_it_is_beside_packed_ones() -> None:
    """Mostly exact zeros (exponent 0, far from the others): each would be kept whole, at 6 bytes."""
    torch.manual_seed(0)
    dense = (torch.randn(4, 32, 32) * 0.02).to(torch.bfloat16)
    sparse = dense.clone()
    sparse[:, :, 8:] = 0
    host = HostStore([Experts(dense.clone()), Experts(sparse.clone())], pinned=None)
    assert host.packed and isinstance(host.expert((0, 1)), PackedExpert) and isinstance(host.expert((1, 1)), RawExpert)
    assert host.bytes_per_copy == (0.75 * 32 * 32 * 2 + 32 * 32 * 2) / 2  # one layer packed, one raw: no escapes
    for layer, weights in enumerate((dense, sparse)):
        assert same_bits(host.layer_on(layer, torch.device("cpu"))["gate_up_proj"], weights)


def test_other_dtypes_are_kept_as_they_are() -> None:
    host = HostStore([Experts(torch.randn(4, 8, 8).half())], pinned=None)
    assert not host.packed and host.bytes_per_copy == 8 * 8 * 2
