"""Files shipped with the project: the bundled demo model and its companions."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEMO_MODEL = "seqmoe-demo"


def resources_dir() -> Path:
    """``resources/`` of a source checkout, of a PyInstaller bundle, or ``$SEQMOE_RESOURCES``."""
    override = os.environ.get("SEQMOE_RESOURCES")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def demo_model_dir() -> Path:
    return resources_dir() / "models" / DEMO_MODEL
