"""What the wheel holds: every package of the source tree, and the resources, found where it puts them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import seqmoe_resources

from seqmoe import resources

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_lists_every_package_of_the_source_tree_and_the_resources() -> None:
    # Listed by hand (resources/ is mapped to a package of its own): a new subpackage left out of
    # the list would be missing from an installed app, though every test here passed.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    found = {"seqmoe_resources"} | {
        ".".join((top, *init.parent.relative_to(ROOT / folders[top]).parts))
        for top in ("seqmoe", "seqmoe_chat")
        for init in (ROOT / folders[top]).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found


def test_installed_outside_a_checkout_the_resources_are_the_package_seqmoe_resources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in a wheel: resources/ is no longer beside the engine's folder ('no such model folder').
    monkeypatch.delenv("SEQMOE_RESOURCES", raising=False)
    monkeypatch.setattr(resources, "__file__", str(tmp_path / "site-packages" / "seqmoe" / "resources.py"))
    assert (resources.demo_model_dir() / "config.json").is_file()
    assert resources.resources_dir() == Path(seqmoe_resources.__file__).parent
