"""Where the app keeps its data and its settings: the platform's folders unless told otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "seqmoe-chat"
DATA_DIR_ENV = "SEQMOE_CHAT_DATA_DIR"
CONFIG_DIR_ENV = "SEQMOE_CHAT_CONFIG_DIR"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """``override``, else ``$SEQMOE_CHAT_DATA_DIR``, else e.g. ``~/.local/share/seqmoe-chat``."""
    chosen = override or os.environ.get(DATA_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return platformdirs.user_data_path(APP_NAME, appauthor=False)


def config_dir(data_folder: Path) -> Path:
    """``$SEQMOE_CHAT_CONFIG_DIR``, else the platform's config folder (e.g. ``~/.config/seqmoe-chat``)
    when the data live in the platform's data folder, else ``data_folder`` itself: a chosen
    data folder is a whole profile, so tests and the self-test never touch the real settings."""
    chosen = os.environ.get(CONFIG_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    if data_folder.resolve() == platformdirs.user_data_path(APP_NAME, appauthor=False).resolve():
        return platformdirs.user_config_path(APP_NAME, appauthor=False)
    return data_folder


def folder_problem(error: Exception) -> str:
    """Why a data folder could not be made or opened (an ``OSError`` or a database's error), in words."""
    if isinstance(error, FileExistsError):
        return "it is not a folder"
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)
