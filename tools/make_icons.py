"""Renders the app icon's PNG sizes, the Windows ICO and the macOS ICNS from its SVG.

    .venv/bin/python tools/make_icons.py

Writes next to ``resources/icons/seqmoe-chat.svg``; the outputs are committed, so neither
the app nor the bundle builds need Pillow. Writing ICO and ICNS needs the ``packaging``
extra (Pillow); rendering is Qt's alone, so the tests can check the PNGs are current.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from PySide6.QtCore import QBuffer, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from seqmoe_chat.app_metadata import ICON_SIZES, ICON_STEM

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
SVG = ICONS / f"{ICON_STEM}.svg"
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # 256 is the largest a Windows ICO holds
ICNS_SIZES = (16, 32, 64, 128, 256, 512, 1024)  # 1024 is 512@2x for Retina screens


def render(size: int) -> QImage:
    """The SVG at ``size`` x ``size`` pixels on a transparent background (needs a QGuiApplication)."""
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {SVG}")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image


def write_multi_size(images: dict[int, QImage], path: Path, sizes: tuple[int, ...], fmt: str) -> None:
    """One file holding every size, each rendered at that size rather than scaled down by Pillow."""
    from PIL import Image

    def to_pillow(image: QImage) -> Image.Image:
        buffer = QBuffer()
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")
        return Image.open(io.BytesIO(buffer.data().data())).convert("RGBA")

    largest, *others = [to_pillow(images[size]) for size in sorted(sizes, reverse=True)]
    largest.save(path, format=fmt, sizes=[(size, size) for size in sizes], append_images=others)


def main() -> None:
    # Rendering needs a Qt GUI application, but no screen.
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _app = QGuiApplication([])
    images = {size: render(size) for size in sorted({*ICON_SIZES, *ICO_SIZES, *ICNS_SIZES})}
    for size in ICON_SIZES:
        images[size].save(str(ICONS / f"{ICON_STEM}-{size}.png"), "PNG", 0)  # 0: smallest file; PNG is lossless
    write_multi_size(images, ICONS / f"{ICON_STEM}.ico", ICO_SIZES, "ICO")
    write_multi_size(images, ICONS / f"{ICON_STEM}.icns", ICNS_SIZES, "ICNS")
    print(f"wrote {len(ICON_SIZES)} PNG sizes, {ICON_STEM}.ico and {ICON_STEM}.icns to {ICONS}")


if __name__ == "__main__":
    main()
