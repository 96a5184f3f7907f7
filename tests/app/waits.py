"""What the window tests wait for: what the user sees, not the state behind it.

The worker's signals reach the engine client and the window as separate queued calls, so a
test polling the client's state can run between the two and find the window not yet updated.
"""

from __future__ import annotations


def model_shown(window) -> bool:
    """The client holds a model and the window shows it: loading progress gone, its name in the status bar."""
    model = window.client.model
    return model is not None and window.model_bar.progress.isHidden() and window.status.model.text() == model.name
