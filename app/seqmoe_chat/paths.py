"""Where the app keeps its data: the platform's user data folder unless told otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "seqmoe-chat"
DATA_DIR_ENV = "SEQMOE_CHAT_DATA_DIR"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """``override``, else ``$SEQMOE_CHAT_DATA_DIR``, else e.g. ``~/.local/share/seqmoe-chat``."""
    chosen = override or os.environ.get(DATA_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return platformdirs.user_data_path(APP_NAME, appauthor=False)
