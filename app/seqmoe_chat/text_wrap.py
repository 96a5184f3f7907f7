"""How to break the lines of a text shown or edited: anywhere when it holds a long run without a
place to break it."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit

_UNBROKEN_RUN = re.compile(r"(?<![!-~])[!-~]{1000}")
"""A run of 1,000 printable ASCII characters without a space (minified JSON, base64, a long URL).
Other characters are left out: Chinese and Japanese, written without spaces, may be broken between
any two characters, which Qt finds quickly; broken anywhere, the Latin words among them were split.
Anchored at the run's start: unanchored, the search began again at every character of a
shorter run (0.4 s for 212 KiB of 999-character runs)."""


def wrap_mode_for(text: str) -> QTextOption.WrapMode:
    """How to break the lines of ``text``. Qt's default looks for a word boundary in a time that
    grows with the square of a run without one: 212 KiB of minified JSON took 2.4 s to show and
    1.1 s a keystroke in the composer, 0.05 s and 0.03 s broken anywhere."""
    if _UNBROKEN_RUN.search(text):
        return QTextOption.WrapMode.WrapAnywhere
    return QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere


def fit_wrap_mode(view: QPlainTextEdit | QTextEdit, text: str) -> None:
    """Break the lines of ``view``, about to show ``text`` in place of what it holds, as ``text`` needs."""
    mode = wrap_mode_for(text)
    if mode != view.wordWrapMode():
        # Emptied first: laid out again in the new mode, the text it is about to lose would cost
        # what the mode saves (1.6 s for a long run going back to word wrapping).
        view.document().clear()
        view.setWordWrapMode(mode)
