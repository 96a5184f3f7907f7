"""Run by test_persistence: the app with a slow fake engine, chatting, reporting what the
reply shows every 100 ms until the test kills it. Usage: python -m tests.app.kill_target DATA_DIR"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from PySide6.QtCore import QTimer  # noqa: E402

from seqmoe_chat.application import create_application, open_context  # noqa: E402
from seqmoe_chat.main_window import MainWindow  # noqa: E402

from .fakes import FakeBackend  # noqa: E402


def main() -> None:
    app = create_application()
    backend = FakeBackend(token_delay_s=0.01, repeat=500)
    window = MainWindow(open_context(Path(sys.argv[1]), backend.open))
    window.show()
    window.start()

    def report() -> None:
        if window.client.model is not None and not window.session.busy and not window.chat.widgets:
            window.composer.set_text("Write a very long story")
            window.composer.submit()
        widgets = list(window.chat.widgets.values())
        if len(widgets) == 2:
            print(f"{time.monotonic()} {len(widgets[1].body.source_text)}", flush=True)

    timer = QTimer()
    timer.timeout.connect(report)
    timer.start(100)
    app.exec()


main()
