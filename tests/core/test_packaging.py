"""What the wheel holds: every package of the source tree, and the resources."""

from __future__ import annotations

import tomllib
from pathlib import Path

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
    assert folders["seqmoe_resources"] == "resources" and setuptools["package-data"]["seqmoe_resources"] == ["**/*"]
