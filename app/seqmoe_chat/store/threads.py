"""The visible thread of a message tree: from a first message down to the current leaf."""

from __future__ import annotations

from collections.abc import Sequence

from .records import Message, ThreadEntry


def children_of(messages: Sequence[Message]) -> dict[int | None, list[int]]:
    """Message ids by parent id (None: the first messages), oldest first."""
    children: dict[int | None, list[int]] = {}
    for message in messages:
        children.setdefault(message.parent_id, []).append(message.id)
    return children


def visible_thread(messages: Sequence[Message], leaf_id: int | None) -> list[ThreadEntry]:
    by_id = {message.id: message for message in messages}
    children = children_of(messages)
    path: list[Message] = []
    seen: set[int] = set()
    # A damaged or hand-edited file may hold a loop of parents: it is cut where it closes.
    while leaf_id is not None and leaf_id in by_id and leaf_id not in seen:
        seen.add(leaf_id)
        path.append(by_id[leaf_id])
        leaf_id = by_id[leaf_id].parent_id
    entries = []
    for message in reversed(path):
        siblings = children[message.parent_id]
        entries.append(ThreadEntry(message, siblings.index(message.id) + 1, len(siblings), siblings))
    return entries


def latest_leaf(messages: Sequence[Message], message_id: int) -> int:
    """The end of the newest line of replies below ``message_id``."""
    children = children_of(messages)
    seen = {message_id}
    # As in ``visible_thread``, a loop of parents ends where it would come round again.
    while children.get(message_id) and children[message_id][-1] not in seen:
        message_id = children[message_id][-1]
        seen.add(message_id)
    return message_id
