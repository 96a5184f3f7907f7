"""The calibration child: ``seqmoe calibrate`` that ends when the app does, so a crashed app
leaves no calibration using every core and writing a predictor nobody asked for any more.

    python -m seqmoe_chat.models.calibration_child --model PATH [calibrate's options]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from seqmoe.cli import main as seqmoe_main

from .child_process import exit_with_parent


def main(argv: Sequence[str] | None = None) -> int:
    exit_with_parent()
    return seqmoe_main(["calibrate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
