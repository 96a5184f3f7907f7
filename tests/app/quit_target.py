"""Run by test_persistence: the app closed while its engine is inside a loading stage longer
than the wait for it, with a message waiting for the model. Usage: python -m tests.app.quit_target DATA_DIR"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from PySide6.QtCore import QTimer  # noqa: E402

from seqmoe_chat import engine_client  # noqa: E402
from seqmoe_chat.application import create_application, leave, open_context  # noqa: E402
from seqmoe_chat.main_window import MainWindow  # noqa: E402

from .fakes import FakeBackend  # noqa: E402


def main() -> int:
    engine_client.SHUT_DOWN_WAIT_MS = 300
    app = create_application()
    window = MainWindow(open_context(Path(sys.argv[1]), FakeBackend(load_delay_s=30).open))
    window.show()
    window.start()
    window.composer.set_text("Are you there?")
    window.composer.submit()
    QTimer.singleShot(500, window.close)
    return leave(window.context.client, app.exec())


sys.exit(main())
