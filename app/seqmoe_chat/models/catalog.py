"""The curated catalog of MoE models, shipped as data in ``resources/catalog.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model_shape import ModelShape, shape_of_catalog_entry

CATALOG_FORMAT = "seqmoe-catalog"
CATALOG_VERSION = 1


class CatalogError(Exception):
    """The shipped catalog is missing or damaged (a packaging fault)."""


@dataclass(frozen=True)
class CatalogEntry:
    repo_id: str
    name: str
    summary: str
    shape: ModelShape
    download_bytes: int
    license: str
    gated: bool | str  # False, or the hub's gating mode ("auto": granted at once, "manual")
    runs: bool
    refusal: str  # why the engine cannot run it, when it cannot
    notes: str
    stored_dtype: str  # how the experts are stored in the checkpoint
    stored_bytes_per_expert: int  # on disk, when it differs from the engine's (a quantized checkpoint)


def catalog_path() -> Path:
    from seqmoe.resources import resources_dir

    return resources_dir() / "catalog.json"


def load_catalog(path: Path | None = None) -> list[CatalogEntry]:
    file = path or catalog_path()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        if data.get("format") != CATALOG_FORMAT or data.get("version") != CATALOG_VERSION:
            raise CatalogError(f"{file} is not a version {CATALOG_VERSION} {CATALOG_FORMAT} file")
        return [_entry(raw) for raw in data["models"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CatalogError(f"the model catalog {file} could not be read: {error}") from None


def _entry(raw: dict[str, Any]) -> CatalogEntry:
    engine = raw["engine"]
    return CatalogEntry(
        repo_id=raw["id"],
        name=raw["name"],
        summary=raw["summary"],
        shape=shape_of_catalog_entry(raw),
        download_bytes=int(raw["download_bytes"]),
        license=raw["license"],
        gated=raw["gated"],
        runs=bool(engine["runs"]),
        refusal=engine.get("reason", ""),
        notes=raw["notes"],
        stored_dtype=raw.get("stored_dtype", raw["dtype"]),
        stored_bytes_per_expert=int(raw.get("stored_bytes_per_expert", raw["bytes_per_expert"])),
    )
