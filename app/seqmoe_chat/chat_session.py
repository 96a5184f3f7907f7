"""The chat's behaviour: sending, stopping, regenerating and editing, and keeping the
database current while a reply streams.

A user message is in the database before it goes to the engine; a streaming reply is
saved at least every ``SAVE_INTERVAL_S`` and when it ends. Signals of a request that is
no longer the active one (after Stop, Regenerate or an edit) are dropped, except for
the statistics of a stopped reply, which arrive within a token of Stop.

When the database refuses a write (a full disk, a read-only or locked file), the chat goes
on: a message that could not be saved is not sent (the composer keeps it), a reply's
changes are kept and written with the next write that succeeds, and ``sig_save_failed``
says so once until writing works again.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal, Slot

from .engine_client import EngineClient
from .stall_monitor import StallMonitor
from .store import ConversationStore, Message, SamplingSettings, ThreadEntry
from .store.conversations import DEFAULT_TITLE
from .store.records import ASSISTANT, DONE, FAILED, STOPPED, STREAMING, USER
from .worker import ReplyResult

SAVE_INTERVAL_S = 0.5
NO_MODEL = "No model is loaded; load one from the toolbar."
TITLE_CHARS = 48


@dataclass
class _Reply:
    request_id: int
    message_id: int
    conversation_id: int
    prompt: list[dict[str, str]]
    sampling: SamplingSettings
    waits_for: int | None  # the load in progress when the reply was asked for
    text: str = ""
    saved_at: float = 0.0


class ChatSession(QObject):
    sig_thread_changed = Signal()  # the shown conversation's thread must be redrawn
    sig_message_added = Signal(object)  # a Message appended to the shown thread
    sig_reply_streamed = Signal(int, str, int)  # message id, text so far, tokens so far
    sig_message_changed = Signal(object)  # a Message whose content, state or statistics changed
    sig_busy_changed = Signal(bool)
    sig_conversations_changed = Signal()  # titles or order of the conversation list
    sig_model_needed = Signal()  # a reply was asked for while no model is loaded or loading
    sig_save_failed = Signal(str)  # the database refused a write (its reason); said once until one succeeds

    def __init__(self, store: ConversationStore, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.client = client
        self.conversation_id: int | None = None
        self.default_sampling = SamplingSettings()
        self.stall_monitor = StallMonitor(self)
        self._active: _Reply | None = None
        self._stopped: dict[int, int] = {}  # request id -> message id, for late statistics
        self._unsaved: dict[int, dict] = {}  # message id -> reply fields the database refused so far
        self._save_failing = False
        worker = client.worker
        worker.sig_reply_streamed.connect(self._on_streamed)
        worker.sig_reply_finished.connect(self._on_finished)
        worker.sig_reply_failed.connect(self._on_failed)
        worker.sig_reply_needs_model.connect(self._on_needs_model)

    @property
    def busy(self) -> bool:
        return self._active is not None

    @property
    def active_conversation_id(self) -> int | None:
        """The conversation whose reply is streaming, if any; it need not be the one shown."""
        return self._active.conversation_id if self._active else None

    def open(self, conversation_id: int | None) -> None:
        self.conversation_id = conversation_id
        self.sig_thread_changed.emit()

    def new_conversation(self) -> int:
        """A fresh conversation, unless the shown one is still empty."""
        shown = self.conversation_id
        if shown is not None and self.store.exists(shown) and self.store.get(shown).current_leaf_id is None:
            return shown
        conversation = self.store.create(sampling=self.default_sampling)
        self.open(conversation.id)
        self.sig_conversations_changed.emit()
        return conversation.id

    def send(self, text: str) -> bool:
        text = _as_sent(text)
        if not text or self.busy:
            return False
        try:
            if self.conversation_id is None or not self.store.exists(self.conversation_id):
                self.new_conversation()
            conversation = self.store.get(self.conversation_id)
            message = self.store.add_message(conversation.id, conversation.current_leaf_id, USER, text, DONE)
            if conversation.current_leaf_id is None and conversation.title == DEFAULT_TITLE:
                self.store.rename(conversation.id, _title_from(text))
        except sqlite3.Error as error:
            self._save_failed(error)
            return False
        self.sig_message_added.emit(message)
        reply = self._start_reply(conversation.id, message.id)
        if reply is not None:
            self.sig_message_added.emit(reply)
        self.sig_conversations_changed.emit()
        return True

    def stop(self) -> None:
        if self._active is None:
            return
        reply = self._active
        self.client.cancel(reply.request_id)
        self._stopped[reply.request_id] = reply.message_id
        self._finish(reply, state=STOPPED, content=reply.text)

    def regenerate(self, message_id: int) -> None:
        """A new reply in place of ``message_id``; the old one stays as an earlier version."""
        self.stop()
        message = self.store.message(message_id)
        self._start_reply(message.conversation_id, message.parent_id)
        self.sig_thread_changed.emit()

    def resend_edited(self, message_id: int, text: str) -> None:
        """Send ``text`` in place of a user message; what followed it stays as an earlier version."""
        text = _as_sent(text)
        if not text:
            return
        self.stop()
        original = self.store.message(message_id)
        try:
            edited = self.store.add_message(original.conversation_id, original.parent_id, USER, text, DONE)
        except sqlite3.Error as error:
            self._save_failed(error)
            return
        self._start_reply(original.conversation_id, edited.id)
        self.sig_thread_changed.emit()
        self.sig_conversations_changed.emit()

    def select_version(self, message_id: int) -> None:
        if self.busy:
            return
        self.store.select_version(message_id)
        self.sig_thread_changed.emit()

    def _start_reply(self, conversation_id: int, parent_id: int) -> Message | None:
        """The reply's message, streaming; ``None`` when the database refused it (reported)."""
        conversation = self.store.get(conversation_id)
        prompt = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
        prompt += [
            {"role": entry.message.role, "content": entry.message.content}
            for entry in self.thread(conversation_id, leaf_id=parent_id)
            if entry.message.content
        ]
        try:
            reply = self.store.add_message(conversation_id, parent_id, ASSISTANT, "", STREAMING)
        except sqlite3.Error as error:
            self._save_failed(error)
            return None
        if self.client.model is None and not self.client.busy_loading:
            self.sig_model_needed.emit()
        request_id = self.client.generate(prompt, conversation.sampling)
        self._active = _Reply(request_id, reply.id, conversation_id, prompt, conversation.sampling, self.client.loading_id,
                              saved_at=time.monotonic())
        self.stall_monitor.start()
        self.sig_busy_changed.emit(True)
        return reply

    @Slot(int, str, int)
    def _on_streamed(self, request_id: int, text: str, tokens: int) -> None:
        reply = self._active
        if reply is None or reply.request_id != request_id:
            return
        reply.text = text
        self.sig_reply_streamed.emit(reply.message_id, text, tokens)
        now = time.monotonic()
        if now - reply.saved_at >= SAVE_INTERVAL_S:
            self._save(reply.message_id, content=text)
            reply.saved_at = now

    @Slot(int, object)
    def _on_finished(self, request_id: int, result: ReplyResult) -> None:
        reply = self._active
        if reply is not None and reply.request_id == request_id:
            state = STOPPED if result.stopped else DONE
            self._finish(reply, state=state, content=result.text, stats=result.stats, model_id=result.model_id)
        elif request_id in self._stopped:
            # The worker's text as it stopped: the stream shown at Stop lags it (a reply stopped as
            # it ended was kept empty, its statistics counting tokens it did not hold).
            message_id = self._stopped.pop(request_id)
            self._save(message_id, content=result.text, stats=result.stats, model_id=result.model_id)
            self.sig_message_changed.emit(self._message(message_id))

    @Slot(int, str, str)
    def _on_failed(self, request_id: int, reason: str, text: str) -> None:
        self._stopped.pop(request_id, None)
        reply = self._active
        if reply is not None and reply.request_id == request_id:
            self._finish(reply, state=FAILED, content=text or reply.text, error=reason)

    @Slot(int)
    def _on_needs_model(self, request_id: int) -> None:
        reply = self._active
        if reply is None or reply.request_id != request_id:
            return
        if self.client.busy_loading and self.client.loading_id != reply.waits_for:
            # The load it waited for gave way to another (the user chose a model meanwhile): it
            # waits for that one, queued behind it. Only for a newer load: one whose outcome never
            # came would send it back and forth without end.
            reply.waits_for = self.client.loading_id
            reply.request_id = self.client.generate(reply.prompt, reply.sampling)
            return
        self._finish(reply, state=FAILED, content=reply.text, error=NO_MODEL)

    def _finish(self, reply: _Reply, *, state: str, content: str, error: str = "", stats: dict | None = None,
                model_id: str | None = None) -> None:
        self._active = None
        stall_ms = self.stall_monitor.stop()
        if stats is not None:
            stats = {**stats, "gui_stall_ms": round(stall_ms, 1)}
        self._save(reply.message_id, content=content, state=state, error=error, stats=stats, model_id=model_id)
        self.sig_message_changed.emit(self._message(reply.message_id))
        self.sig_busy_changed.emit(False)
        self.sig_conversations_changed.emit()

    def _save(self, message_id: int, **fields: object) -> None:
        """Change a reply's ``fields`` (``None``: unchanged) in the database, after any changes it
        refused before; what it refuses now waits for the next write."""
        pending = self._unsaved.setdefault(message_id, {})
        pending.update((name, value) for name, value in fields.items() if value is not None)
        try:
            self._flush()
        except sqlite3.Error as error:
            self._save_failed(error)

    def _flush(self) -> None:
        for message_id, fields in list(self._unsaved.items()):
            self.store.update_message(message_id, **fields)
            del self._unsaved[message_id]
        self._save_failing = False

    def _save_failed(self, error: sqlite3.Error) -> None:
        if not self._save_failing:
            self._save_failing = True
            self.sig_save_failed.emit(str(error))

    def thread(self, conversation_id: int, leaf_id: int | None = None) -> list[ThreadEntry]:
        """The thread as ``ConversationStore.thread`` gives it, with the changes the database has
        not taken yet: a reply it refused is shown, and sent to the model, as it ended."""
        return [dataclasses.replace(entry, message=self._with_unsaved(entry.message))
                for entry in self.store.thread(conversation_id, leaf_id)]

    def _message(self, message_id: int) -> Message:
        return self._with_unsaved(self.store.message(message_id))

    def _with_unsaved(self, message: Message) -> Message:
        """``message`` as stored, with the changes the database has not taken yet."""
        return dataclasses.replace(message, **self._unsaved.get(message.id, {}))


def _as_sent(text: str) -> str:
    """``text`` without the blank lines before it and the whitespace after it; the indentation
    of its first line stays (pasted code)."""
    return re.sub(r"\A(?:[ \t]*\r?\n)+", "", text).rstrip()


def _title_from(text: str) -> str:
    line = " ".join(next(line for line in text.splitlines() if line.strip()).split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"
