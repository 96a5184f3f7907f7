"""Objects that live as long as the app or its model, kept out of the collector's full passes.

PyTorch, transformers and a loaded model leave 390,000 to 470,000 objects in the app's
process, and a full collection walks every one of them on the GUI thread (the only one that
collects: ``application.garbage_collected_on_this_thread``): 180 to 240 ms each on a 2-core
machine, a stutter in a streaming reply. Frozen once a model has loaded or gone
(``gc.freeze``), they are skipped. What among them turns to garbage later (a closed
dialog's reference cycles) waits for the next change of model, which unfreezes as it is asked
for: a cycle that reached the model going is collected before the next one is in memory too.
"""

from __future__ import annotations

import gc


def thaw() -> None:
    """Let collections find the frozen objects again; on the GUI thread."""
    gc.unfreeze()


def settle() -> None:
    """Collect everything, the objects frozen before included, and freeze what is left.
    On the GUI thread, as every collection."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
