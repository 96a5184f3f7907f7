"""Random use of the window with the fake engine: sending, stopping, regenerating, editing,
switching, deleting and undoing, loading, unloading and resizing the cache, in any order and
at any moment of a streaming reply. Afterwards no reply is left streaming, the app still
chats, and the chat shown is the one stored."""

from __future__ import annotations

import dataclasses
import random

import pytest

from seqmoe_chat.store.records import DONE, STREAMING

from .test_chat import send, shown
from .waits import model_shown


def act(qtbot, window, backend, rng: random.Random) -> None:
    """One thing a user (or a failing engine) might do now."""
    choice = rng.choice(("send", "send", "send", "stop", "regenerate", "new", "unload", "load", "switch",
                         "delete", "undo", "resize", "edit", "engine fails"))
    if choice == "send":
        send(qtbot, window, rng.choice(("hi", "tell me more", "a " * 30)))
    elif choice == "stop":
        window.action_stop.trigger()
    elif choice == "regenerate":
        window.action_regenerate.trigger()
    elif choice == "new":
        window.action_new.trigger()
    elif choice == "unload":
        window.action_unload.trigger()
    elif choice == "load":
        window.action_load.trigger()
    elif choice == "switch" and window.sidebar.ids():
        window.sidebar.list.setCurrentRow(rng.randrange(len(window.sidebar.ids())))
    elif choice == "delete":
        window.action_delete.trigger()
    elif choice == "undo" and window.sidebar.undo_button.isVisible():
        window.sidebar.undo_button.click()
    elif choice == "resize":
        window.client.reconfigure(dataclasses.replace(window.settings.engine, cache_ratio=rng.choice((0.3, 0.45, 0.8))))
    elif choice == "edit":
        mine = [w for w in window.chat.widgets.values() if w.message.role == "user"]
        if mine:
            widget = rng.choice(mine)
            widget.sig_edit_submitted.emit(widget.message.id, f"edited {rng.random():.3f}")
    elif choice == "engine fails":
        backend.fail_after = rng.choice((None, 2))
    qtbot.wait(rng.choice((0, 1, 5, 20, 60)))


@pytest.mark.parametrize("seed", range(6))
def test_any_order_of_actions_leaves_the_app_consistent(qtbot, make_window, backend, seed: int) -> None:
    rng = random.Random(seed)
    backend.token_delay_s, backend.repeat, backend.load_delay_s = 0.003, 3, 0.02
    window = make_window()
    for _ in range(40):
        act(qtbot, window, backend, rng)
    backend.fail_after = None
    window.action_stop.trigger()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10_000)
    for conversation_id in window.store_ids():
        assert all(e.message.state != STREAMING for e in window.store.thread(conversation_id))
    if window.session.conversation_id is not None:
        thread = window.store.thread(window.session.conversation_id)
        assert shown(window) == [(e.message.role, e.message.content) for e in thread]
    window.action_load.trigger()
    qtbot.waitUntil(lambda: model_shown(window), timeout=10_000)
    window.action_new.trigger()
    send(qtbot, window, "Still there?")
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10_000)
    assert window.store.thread(window.session.conversation_id)[-1].message.state == DONE
