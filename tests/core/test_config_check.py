"""``check_supported`` answers from the config alone and hands back what it measured."""

from __future__ import annotations

from pathlib import Path

from seqmoe.loader import check_supported, find_experts, read_config


def test_check_supported_returns_the_meta_model_it_checked(tiny_models: dict[str, Path]) -> None:
    skeleton = check_supported(read_config(tiny_models["olmoe"]))
    experts = find_experts(skeleton)
    assert len(experts) == 3
    assert all(p.device.type == "meta" for p in skeleton.parameters())
