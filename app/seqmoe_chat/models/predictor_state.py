"""Whether a model has a calibrated SeqMoE predictor, read from the files that calibration
writes (``seqmoe.predictor.calibration``: the user cache, or ``resources/predictors``)
without loading the model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine_import import import_engine

NOT_CALIBRATED = "not calibrated"


@dataclass(frozen=True)
class PredictorState:
    calibrated: bool
    summary: str
    path: Path | None = None


def predictor_state(folder: Path) -> PredictorState:
    import_engine()
    from seqmoe.predictor.calibration import bundled_predictor_paths, user_predictor_path

    try:
        config_sha256 = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    except OSError:
        return PredictorState(False, NOT_CALIBRATED)
    user = user_predictor_path({"name": folder.name, "config_sha256": config_sha256})
    for path in (user, *bundled_predictor_paths()):
        stored = _predictor_config(path)
        model = stored.get("model", {}) if stored else {}
        if model.get("config_sha256") == config_sha256 and model.get("name") == folder.name:
            origin = "calibrated" if path == user else "calibrated (shipped)"
            return PredictorState(True, f"{origin}: {_quality(stored.get('report', {}))}", path)
    return PredictorState(False, NOT_CALIBRATED)


def _predictor_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # a damaged predictor counts as none, as the engine treats it
    return value if isinstance(value, dict) else None


def _quality(report: dict[str, Any]) -> str:
    """Recall when the predictor's report has it (the first horizon), else its validation loss."""
    for key, value in report.items():
        if key.startswith("recall"):
            first = value[0] if isinstance(value, list) and value else value
            if isinstance(first, (int, float)):
                return f"{key} {first:.0%}"
    loss, tokens = report.get("validation_loss"), report.get("training_tokens")
    if isinstance(loss, (int, float)):
        trained = f" after {tokens:,} tokens" if isinstance(tokens, int) else ""
        return f"validation loss {loss:.3f}{trained} (no recall recorded)"
    return "no quality figures recorded"
