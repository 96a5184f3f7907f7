"""What one expert's copy costs on a device, part by part: its raw bytes' copy, its packed bytes'
copy, and the unpacking after it (``compression``).

On CUDA, ``CudaCopier`` copies a packed expert's bytes and unpacks them into the slot on one
stream, so the link carries nothing while an expert unpacks; the emulated link charges
unpacking to compute instead and keeps the link busy. No GPU has run this project yet: this tool
says, on one, how much of a packed copy's time the unpacking takes, which is what a second
stream for the unpacking (or one fused kernel) would give back.

    python tools/time_copies.py --device cuda --shape olmoe

The weights are random, spread as trained weights are (normal, standard deviation 0.02), so
they pack as the demo's experts do (75% of the bytes); how well a real checkpoint packs was not
measured. On the CPU the copies are memory copies (what the emulated link does when a copy ends)
and the unpacking runs on the calling thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from seqmoe.compression import PackedExpert, RawExpert, pack

SHAPES = {
    "demo": (192, 96),
    "olmoe": (2048, 1024),
    "qwen3-30b-a3b": (2048, 768),
    "mixtral-8x7b": (4096, 14336),
}
"""Hidden size and expert intermediate size: an expert is a ``[2 * intermediate, hidden]`` gate and
up projection and a ``[hidden, intermediate]`` down projection (transformers' fused layout);
the last three are ``seqmoe.hardware.SHAPES``' experts."""


@dataclass(frozen=True)
class CopyTimes:
    device: str
    shape: str
    raw_bytes: int
    packed_bytes: int
    raw_copy_s: float
    packed_copy_s: float | None
    """``None`` on the CPU: there the unpacking reads the host's packed bytes where they lie."""
    unpack_s: float
    packed_copy_and_unpack_s: float

    @property
    def unpack_share(self) -> float | None:
        """The part of a packed copy, as the CUDA copier makes it, spent unpacking (``None`` on the CPU)."""
        return None if self.packed_copy_s is None else self.unpack_s / self.packed_copy_and_unpack_s

    def report(self) -> str:
        def line(name: str, seconds: float, nbytes: int | None = None) -> str:
            rate = f"  ({nbytes / seconds / 1e9:.1f} GB/s)" if nbytes else ""
            return f"  {name:<24}{seconds * 1e3:8.3f} ms{rate}"

        return "\n".join(
            [
                f"one {self.shape} expert on {self.device}: {self.raw_bytes / 2**20:.1f} MiB, packed to "
                f"{self.packed_bytes / self.raw_bytes:.1%}",
                line("raw copy", self.raw_copy_s, self.raw_bytes),
                line("packed bytes' copy", self.packed_copy_s, self.packed_bytes) if self.packed_copy_s is not None
                else "  packed bytes' copy      none: the unpacking reads them in host memory",
                line("unpacking", self.unpack_s),
                line("packed copy + unpacking", self.packed_copy_and_unpack_s),
                self._summary(),
            ]
        )

    def _summary(self) -> str:
        ratio = self.packed_copy_and_unpack_s / self.raw_copy_s
        if self.unpack_share is None:
            return f"the emulated link's packed copy costs compute {ratio:.1f} times its raw copy (a memory copy)"
        return f"a packed copy takes {ratio:.2f} of a raw one; unpacking is {self.unpack_share:.0%} of it"



def expert_tensors(hidden: int, intermediate: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(2 * intermediate, hidden), (hidden, intermediate)]
    return [(torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16) for shape in shapes]


def time_copies(shape: str, device: torch.device, repeats: int = 20) -> CopyTimes:
    """Median times of each part over ``repeats`` runs, after a warm-up, from pinned host memory on CUDA;
    raises if an unpacked expert is not the original bit for bit."""
    tensors = expert_tensors(*SHAPES[shape])
    pin = device.type == "cuda"
    raw = RawExpert(tuple(t.pin_memory() if pin else t for t in tensors))
    packed = pack(tensors)
    if pin:
        packed = PackedExpert(packed.data.pin_memory(), packed.escapes.pin_memory(), packed.segments)
    on_device = PackedExpert(packed.data.to(device), packed.escapes.to(device), packed.segments)
    slots = [torch.empty_like(t, device=device) for t in tensors]

    def copy_packed_bytes() -> None:
        packed.data.to(device, non_blocking=True)
        packed.escapes.to(device, non_blocking=True)

    times = CopyTimes(
        device=torch.cuda.get_device_name(device) if pin else "cpu",
        shape=shape,
        raw_bytes=raw.nbytes,
        packed_bytes=packed.nbytes,
        raw_copy_s=_median_seconds(lambda: raw.write_into(slots, non_blocking=True), device, repeats),
        packed_copy_s=_median_seconds(copy_packed_bytes, device, repeats) if pin else None,
        unpack_s=_median_seconds(lambda: on_device.write_into(slots), device, repeats),
        packed_copy_and_unpack_s=_median_seconds(lambda: packed.write_into(slots, non_blocking=True), device, repeats),
    )
    if not all(torch.equal(slot.cpu().view(torch.int16), t.view(torch.int16)) for slot, t in zip(slots, tensors)):
        raise AssertionError("the unpacked expert differs from the original")
    return times


def _median_seconds(work: Callable[[], None], device: torch.device, repeats: int) -> float:
    """After a warm-up, on CUDA timed with events on a side stream, as the copier's copies run."""
    samples = []
    if device.type == "cuda":
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            # On the stream timed: on another, nothing orders the first sample after it.
            work()
            for _ in range(repeats):
                began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                began.record(stream)
                work()
                ended.record(stream)
                ended.synchronize()
                samples.append(began.elapsed_time(ended) / 1e3)
    else:
        work()
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="repeat for several (default: olmoe)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU visible to PyTorch")
    results = [time_copies(shape, device, args.repeats) for shape in args.shape or ["olmoe"]]
    if args.json:
        print(json.dumps([asdict(r) | {"unpack_share": r.unpack_share} for r in results], indent=1))
    else:
        print("\n".join(r.report() for r in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
