"""The icon files that tools/make_icons.py generates: every size, and current with the SVG."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QImage

from seqmoe_chat.app_metadata import ICON_SIZES, ICON_STEM, icon_png, icons_dir

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_icons.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("make_icons", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rgba(image: QImage) -> np.ndarray:
    image = image.convertToFormat(QImage.Format.Format_RGBA8888)
    pixels = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.sizeInBytes())
    return pixels.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 4].astype(np.int16)


@pytest.mark.parametrize("size", ICON_SIZES)
def test_png_sizes_exist_and_match_the_svg(qapp, size: int) -> None:
    committed = QImage(str(icon_png(size)))
    assert (committed.width(), committed.height()) == (size, size)
    assert committed.hasAlphaChannel()
    # A fresh render of the SVG: a PNG not regenerated after the SVG changed fails here. Other
    # Qt versions antialias edges a little differently, hence the tolerance.
    difference = np.abs(rgba(committed) - rgba(load_tool().render(size)))
    assert difference.mean() < 1.0 and np.percentile(difference, 99) < 32


def test_ico_holds_every_windows_size() -> None:
    data = (icons_dir() / f"{ICON_STEM}.ico").read_bytes()
    reserved, kind, count = struct.unpack_from("<HHH", data)
    assert (reserved, kind) == (0, 1)
    # Each directory entry starts with width and height; 0 stands for 256.
    sizes = {data[6 + 16 * i] or 256 for i in range(count)}
    assert sizes == set(load_tool().ICO_SIZES)


def test_icns_holds_the_retina_sizes() -> None:
    data = (icons_dir() / f"{ICON_STEM}.icns").read_bytes()
    assert data[:4] == b"icns" and struct.unpack_from(">I", data, 4)[0] == len(data)
    kinds, offset = set(), 8
    while offset < len(data):
        kind, length = struct.unpack_from(">4sI", data, offset)
        kinds.add(kind.decode())
        offset += length
    # ic07..ic10: 128, 256, 512 and 1024 (512@2x) pixels, as PNG.
    assert {"ic07", "ic08", "ic09", "ic10"} <= kinds
