"""Renders the app icon's PNG sizes, the Windows ICO and the macOS ICNS from its SVG.

    .venv/bin/python tools/make_icons.py

Writes next to ``resources/icons/seqmoe-chat.svg``; the outputs are committed, so neither
the app nor the bundle builds need Pillow. Needs the ``packaging`` extra (Pillow).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image
from PySide6.QtCore import QBuffer, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from seqmoe_chat.app_metadata import ICON_SIZES, ICON_STEM

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # 256 is the largest a Windows ICO holds
ICNS_SIZES = (16, 32, 64, 128, 256, 512, 1024)  # 1024 is 512@2x for Retina screens


def render(renderer: QSvgRenderer, size: int) -> Image.Image:
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return Image.open(io.BytesIO(buffer.data().data())).convert("RGBA")


def save_all(images: dict[int, Image.Image], path: Path, sizes: tuple[int, ...], fmt: str) -> None:
    """One file holding every size, each rendered at that size rather than scaled down by Pillow."""
    largest, *others = [images[size] for size in sorted(sizes, reverse=True)]
    largest.save(path, format=fmt, sizes=[(size, size) for size in sizes], append_images=others)


def main() -> None:
    # Rendering needs a Qt GUI application, but no screen.
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _app = QGuiApplication([])
    renderer = QSvgRenderer(str(ICONS / f"{ICON_STEM}.svg"))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {ICONS / f'{ICON_STEM}.svg'}")
    images = {size: render(renderer, size) for size in sorted({*ICON_SIZES, *ICO_SIZES, *ICNS_SIZES})}
    for size in ICON_SIZES:
        images[size].save(ICONS / f"{ICON_STEM}-{size}.png", optimize=True)
    save_all(images, ICONS / f"{ICON_STEM}.ico", ICO_SIZES, "ICO")
    save_all(images, ICONS / f"{ICON_STEM}.icns", ICNS_SIZES, "ICNS")
    print(f"wrote {len(ICON_SIZES)} PNG sizes, {ICON_STEM}.ico and {ICON_STEM}.icns to {ICONS}")


if __name__ == "__main__":
    main()
