"""Files shipped with the project: the bundled demo model and its companions."""

from __future__ import annotations

import os
import sys
from importlib.resources import files
from pathlib import Path

DEMO_MODEL = "seqmoe-demo"


def resources_dir() -> Path:
    """``resources/`` of a source checkout (installed editable, or run from source), of a PyInstaller
    bundle, of an installed wheel (the package ``seqmoe_resources``), or ``$SEQMOE_RESOURCES``."""
    override = os.environ.get("SEQMOE_RESOURCES")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    checkout = Path(__file__).resolve().parents[2] / "resources"
    if (checkout / "__init__.py").is_file():
        return checkout
    return Path(str(files("seqmoe_resources")))


def demo_model_dir() -> Path:
    return resources_dir() / "models" / DEMO_MODEL
