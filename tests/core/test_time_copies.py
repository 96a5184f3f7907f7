"""The copy timing tool (tools/time_copies.py) that scripts/gpu-check runs, on the CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from seqmoe.hardware import SHAPES

TOOL = Path(__file__).resolve().parents[2] / "tools" / "time_copies.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("time_copies", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_its_expert_shapes_are_the_simulators(tool) -> None:
    for name, shape in SHAPES.items():
        hidden, intermediate = tool.SHAPES[name]
        assert 3 * hidden * intermediate * 2 == shape.expert_bytes


def test_it_times_each_part_of_a_copy_and_reports_what_unpacking_takes(tool, capsys) -> None:
    assert tool.main(["--device", "cpu", "--shape", "demo", "--repeats", "3"]) == 0
    report = capsys.readouterr().out
    assert "one demo expert on cpu: 0.1 MiB, packed to 75." in report
    assert "packed bytes' copy      none" in report
    assert "the emulated link's packed copy costs compute" in report


def test_it_refuses_an_expert_that_does_not_come_back_bit_for_bit(tool, monkeypatch) -> None:
    real_pack = tool.pack

    def lossy(tensors):
        packed = real_pack(tensors)
        packed.data[0] ^= 1
        return packed

    monkeypatch.setattr(tool, "pack", lossy)
    with pytest.raises(AssertionError, match="differs"):
        tool.time_copies("demo", tool.torch.device("cpu"), repeats=1)
