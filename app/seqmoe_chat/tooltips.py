"""Tooltips that show text as it was written."""

from __future__ import annotations

import html

from PySide6.QtGui import Qt


def plain_tooltip(text: str) -> str:
    """``text`` as a tooltip shows it, letter for letter: Qt renders a tooltip that looks like HTML
    (a chat titled ``<b>Hi</b>``, a message quoting markup) as HTML, so such text is escaped."""
    if not Qt.mightBeRichText(text):
        return text
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>"
