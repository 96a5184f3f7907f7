"""Reading the values of a JSON transcript: each read checks that a value is one the app
could have written, else raises TranscriptError naming the field and where it is."""

from __future__ import annotations

from typing import Any

from ..store.records import is_number
from .transcript import parse_time

_MISSING = object()


class TranscriptError(ValueError):
    """A file that is not a transcript this app can read; the message says why."""


def is_unicode(text: str) -> bool:
    """False for text holding a lone surrogate (JSON's "\\ud800"), which no file or database
    can store as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Fields:
    """One JSON object of a transcript; ``where`` names it for people ("conversation 1, message 2"),
    empty for the whole file."""

    def __init__(self, values: Any, where: str) -> None:
        if not isinstance(values, dict):
            raise TranscriptError(f"{where} is not an object")
        self.values = values
        self.where = where

    def error(self, key: str, problem: str) -> TranscriptError:
        return TranscriptError(f'{self.where}: "{key}" {problem}' if self.where else f'"{key}" {problem}')

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value, or ``default`` when the key is missing (without a default, it must be there)."""
        if key in self.values:
            return self.values[key]
        if default is _MISSING:
            raise self.error(key, "is missing")
        return default

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise self.error(key, "must be text")
        if not is_unicode(value):
            raise self.error(key, "holds a character that is not valid Unicode")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}")
        return value

    def timestamp(self, key: str, default: Any = _MISSING) -> str:
        value = self.text(key, default)
        try:
            parse_time(value)  # what every export and the chat will do with it
        except (ValueError, OverflowError):
            raise self.error(key, "is not a date and time") from None
        return value

    def integer(self, key: str, default: Any = _MISSING, bounds: tuple[int, int] | None = None) -> int:
        value = self.get(key, default)
        # bool is an int to Python, never to a person writing true
        if not isinstance(value, int) or isinstance(value, bool) or not _within(value, bounds):
            raise self.error(key, f"must be a whole number{_range(bounds)}")
        return value

    def number(self, key: str, default: Any = _MISSING, bounds: tuple[float, float] | None = None) -> float:
        value = self.get(key, default)
        if not is_number(value) or not _within(value, bounds):
            raise self.error(key, f"must be a number{_range(bounds)}")
        return value

    def optional_integer(self, key: str, bounds: tuple[int, int] | None = None) -> int | None:
        """A whole number, or None where the key is missing or null."""
        return None if self.get(key, None) is None else self.integer(key, bounds=bounds)

    def object(self, key: str, default: Any = _MISSING) -> Fields:
        value = self.get(key, default)
        if not isinstance(value, dict):
            raise self.error(key, "must be an object")
        return Fields(value, f"{self.where}, {key}" if self.where else key)

    def objects(self, key: str, name: str) -> list[Fields]:
        """The list of objects under ``key``, each named ``name`` and its place (from 1) in errors."""
        items = self.get(key)
        if not isinstance(items, list):
            raise self.error(key, "must be a list")
        place = f"{self.where}, {name}" if self.where else name
        return [Fields(item, f"{place} {number}") for number, item in enumerate(items, start=1)]


def _within(value: float, bounds: tuple[float, float] | None) -> bool:
    return bounds is None or bounds[0] <= value <= bounds[1]


def _range(bounds: tuple[float, float] | None) -> str:
    return "" if bounds is None else f" from {bounds[0]} to {bounds[1]}"
