"""Light, dark and system themes on Qt's Fusion style, which honours a palette fully on
every platform."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

_DARK = {
    QPalette.ColorRole.Window: "#2b2d30",
    QPalette.ColorRole.WindowText: "#dfe1e5",
    QPalette.ColorRole.Base: "#1e1f22",
    QPalette.ColorRole.AlternateBase: "#2f3136",
    QPalette.ColorRole.ToolTipBase: "#3c3f41",
    QPalette.ColorRole.ToolTipText: "#dfe1e5",
    QPalette.ColorRole.PlaceholderText: "#8c8f94",
    QPalette.ColorRole.Text: "#dfe1e5",
    QPalette.ColorRole.Button: "#35373b",
    QPalette.ColorRole.ButtonText: "#dfe1e5",
    QPalette.ColorRole.BrightText: "#ffffff",
    QPalette.ColorRole.Light: "#4a4d52",
    QPalette.ColorRole.Midlight: "#3e4045",
    QPalette.ColorRole.Mid: "#2a2c2f",
    QPalette.ColorRole.Dark: "#1b1c1e",
    QPalette.ColorRole.Shadow: "#000000",
    QPalette.ColorRole.Highlight: "#2f65ca",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#6ea8fe",
    QPalette.ColorRole.LinkVisited: "#b18cfe",
}
_DARK_DISABLED = "#6f7277"


def is_dark(theme: str) -> bool:
    if theme == "system":
        return QApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
    return theme == "dark"


def apply_theme(app: QApplication, theme: str) -> None:
    """``theme`` is "light", "dark" or "system" (the desktop's choice, light if it has none)."""
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    if not is_dark(theme):
        app.setPalette(app.style().standardPalette())
        return
    palette = QPalette()
    for role, colour in _DARK.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DARK_DISABLED))
    app.setPalette(palette)
