"""Saving what the panel shows: its figures of the current reply as JSON, its charts as PNG."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QWidget

FIGURES_FORMAT = "seqmoe-panel-figures"
FIGURES_VERSION = 1


def export_figures(folder: Path, figures: dict[str, Any], charts: dict[str, QWidget], stamp: str = "") -> list[Path]:
    """Write ``seqmoe-panel-<stamp>.json`` and one ``seqmoe-panel-<stamp>-<chart>.png`` per chart
    into ``folder``; returns the paths written. Raises ``OSError`` when one cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    base = f"seqmoe-panel-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    data = folder / f"{base}.json"
    data.write_text(json.dumps({"format": FIGURES_FORMAT, "version": FIGURES_VERSION, **figures}, indent=1),
                    encoding="utf-8")
    written = [data]
    for name, widget in charts.items():
        image = folder / f"{base}-{name}.png"
        if not widget.grab().save(str(image)):
            raise OSError(f"{image} could not be written")
        written.append(image)
    return written
