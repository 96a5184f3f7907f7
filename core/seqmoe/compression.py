"""Lossless packing of bfloat16 experts, so that fewer bytes cross the link.

Offloaded decode is bound by the link: every expert copied is a copy the next layers may
wait for. A bfloat16 weight is a sign, 8 exponent bits and 7 mantissa bits, and the
exponents of trained weights crowd into a few values (2.6 bits of entropy in the demo
model's experts; DFloat11, Zhang et al. 2025, measured about as much in every LLM it
tried). So each expert is kept packed in host memory, and a copy moves 12 bits a weight:

* one byte of sign and mantissa per weight;
* the exponent as a 4-bit code, the offset from the lowest exponent of the 16-value window
  that holds the most of the tensor's weights, two codes a byte: those of two adjacent
  weights, the first in the low nibble (the last byte of a tensor of odd size has a high
  nibble of 0);
* the weights whose exponent lies outside the window (about 1 in 10,000 in the demo's
  experts) whole, with their positions, written over the unpacked tensor last.

Unpacking is a few elementwise tensor operations, on whatever device the packed bytes were
copied to, and gives back every bit: the slot holds exactly the weights of the unoffloaded
model. A code byte, widened to an int32, is spread over its pair of weights' exponents by one
multiplication (``_SPREAD``), so a tensor takes seven operations, and two more for its escapes,
whatever its size: with the demo's small experts on the CPU, an operation's dispatch costs more
than its arithmetic. Other dtypes (float16, float32, ...) are copied as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

WINDOW = 16
"""Exponents a 4-bit code covers."""
UNPACK_WORKSPACE = 2.0
"""Device memory one unpacking holds beside the slot, in experts' bytes: the packed bytes copied
over (0.75 and 6 bytes a weight kept whole; at most 0.9 on a layer's average, ``WORTH_PACKING``)
and one tensor's codes widened to an int32 a pair of weights, as many bytes as that tensor (two
thirds for the usual gate-and-up projection, all of them for an expert of one tensor). Copies
unpack one at a time, in their stream's order, so the allocator reuses it for the next."""
WORTH_PACKING = 0.9
"""Packed experts are kept only if they take at most this share of the raw bytes (see ``HostStore``)."""
_KEEP_SIGN_AND_MANTISSA = -32641
"""0x807F as int16: of a sign-extended sign-and-mantissa byte, the sign bit and the mantissa."""
_SPREAD = 1 << 7 | 1 << 19
"""A code byte times this has its low code at bit 7 and its high code at bit 23, the exponents'
places of the first and second int16 of an int32 (little-endian, as every device torch runs on);
the cross terms land at bits 11 and 19, which ``_FIELDS`` drops."""
_FIELDS = 0xF << 7 | 0xF << 23
_ALIGN = 4


@dataclass(frozen=True)
class Segment:
    """Where one tensor's parts lie in its expert's packed bytes (offsets in bytes)."""

    numel: int
    base: int
    """The exponent that code 0 stands for."""
    sign_mantissa: int
    """In ``PackedExpert.data``."""
    codes: int
    """In ``PackedExpert.data``."""
    escape_index: int
    """In ``PackedExpert.escapes``: int32 positions, in the tensor, of the weights kept whole."""
    escape_bits: int
    """In ``PackedExpert.escapes``: their int16 bit patterns."""
    escapes: int


@dataclass(frozen=True)
class PackedExpert:
    """One expert's tensors packed: ``data`` of a size set by their shapes, and ``escapes``, the
    weights kept whole (uint8 both; one segment per tensor)."""

    data: torch.Tensor
    escapes: torch.Tensor
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.escapes.numel()

    def write_into(self, destinations: Sequence[torch.Tensor], non_blocking: bool = False) -> None:
        """Unpack into ``destinations`` (bfloat16, contiguous, one per segment), on their device: the
        packed bytes cross to it first, then unpack there (on the current CUDA stream)."""
        device = destinations[0].device
        data = self.data.to(device, non_blocking=non_blocking)
        escapes = self.escapes.to(device, non_blocking=non_blocking)
        for destination, segment in zip(destinations, self.segments):
            unpack_into(destination, data, escapes, segment)


@dataclass(frozen=True)
class RawExpert:
    """One expert's tensors as they are, for dtypes that are not packed."""

    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors)

    def write_into(self, destinations: Sequence[torch.Tensor], non_blocking: bool = False) -> None:
        for destination, source in zip(destinations, self.tensors):
            destination.copy_(source, non_blocking=non_blocking)


def packable(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16


def _aligned(offset: int) -> int:
    return offset + -offset % _ALIGN


def packed_size(numels: Sequence[int]) -> int:
    """Bytes of ``PackedExpert.data`` for tensors of these sizes: a byte and a half a weight."""
    offset = 0
    for count in numels:
        offset = _aligned(_aligned(offset) + count) + (count + 1) // 2
    return _aligned(offset)


def pack(tensors: Sequence[torch.Tensor], data: torch.Tensor | None = None) -> PackedExpert:
    """One expert's bfloat16 ``tensors``, packed into ``data`` (``packed_size`` bytes; new if not given)."""
    if data is None:
        data = torch.empty(packed_size([tensor.numel() for tensor in tensors]), dtype=torch.uint8)
    segments, escaped, offset, escape_offset = [], [], 0, 0
    for tensor in tensors:
        bits = tensor.detach().contiguous().view(-1).view(torch.int16)
        count, pairs = bits.numel(), (bits.numel() + 1) // 2
        code = (bits >> 7).bitwise_and_(0xFF)
        # About 65,536 of the weights are plenty to find where the exponents crowd; the rest only
        # decide how many weights are kept whole.
        counts = torch.bincount(code[:: max(1, count >> 16)], minlength=256)
        base = int(counts.unfold(0, WINDOW, 1).sum(dim=1).argmax())
        code.sub_(base)
        escape_index = code.bitwise_and(-WINDOW).ne_(0).nonzero().view(-1).to(torch.int32)
        code.clamp_(0, WINDOW - 1)
        code[1::2].bitwise_left_shift_(4)  # to the high nibble of the byte of the weight before
        code[::2][: count // 2].bitwise_or_(code[1::2])
        sign_mantissa_at = _aligned(offset)
        codes_at = _aligned(sign_mantissa_at + count)
        # The sign to bit 7 of the byte (the int16 -> uint8 copy keeps the low byte).
        sign_and_mantissa = bits & _KEEP_SIGN_AND_MANTISSA
        data[sign_mantissa_at : sign_mantissa_at + count].copy_(sign_and_mantissa.bitwise_or_(sign_and_mantissa >> 8))
        data[codes_at : codes_at + pairs].copy_(code[::2])
        offset = codes_at + pairs
        escape_bits = bits[escape_index.long()]
        escaped += [escape_index.view(torch.uint8), escape_bits.view(torch.uint8), torch.zeros(-escape_bits.numel() * 2 % _ALIGN, dtype=torch.uint8)]
        segments.append(Segment(count, base, sign_mantissa_at, codes_at, escape_offset, escape_offset + 4 * escape_index.numel(), escape_index.numel()))
        escape_offset += 6 * escape_index.numel() + escaped[-1].numel()
    return PackedExpert(data, torch.cat(escaped), tuple(segments))


def unpack_into(destination: torch.Tensor, data: torch.Tensor, escapes: torch.Tensor, segment: Segment) -> None:
    """Write the tensor ``segment`` of ``data`` describes into ``destination``, bit for bit."""
    count, pairs = segment.numel, (segment.numel + 1) // 2
    # Built in the destination itself: besides the packed bytes, unpacking holds only the widened
    # codes (``UNPACK_WORKSPACE``). Viewed as int16, not int32: a slot of odd size may start at an
    # odd int16. Arithmetic, not a 256-entry table: a gather would do the work of three operations,
    # but on the CPU it takes three times as long as they do on large tensors.
    out = destination.view(-1).view(torch.int16)
    out.copy_(data[segment.sign_mantissa : segment.sign_mantissa + count].view(torch.int8))  # sign-extended
    out.bitwise_and_(_KEEP_SIGN_AND_MANTISSA)
    exponents = data[segment.codes : segment.codes + pairs].int().mul_(_SPREAD).bitwise_and_(_FIELDS)
    exponents.add_(segment.base * (1 << 7 | 1 << 23))  # added, not ORed: base + code carries
    out.bitwise_or_(exponents.view(torch.int16)[:count])
    if segment.escapes:
        index = escapes[segment.escape_index : segment.escape_index + 4 * segment.escapes].view(torch.int32).long()
        out[index] = escapes[segment.escape_bits : segment.escape_bits + 2 * segment.escapes].view(torch.int16)
