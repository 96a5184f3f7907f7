"""The GUI thread's handle on the engine worker: starts its thread, numbers requests,
knows which model is loaded. Nothing here ever waits for the engine, except ``shut_down``
when the app quits."""

from __future__ import annotations

import dataclasses
import itertools

from PySide6.QtCore import QObject, QThread, Signal, Slot

from . import long_lived
from .store import EngineOptions, SamplingSettings
from .worker import EngineOpener, EngineWorker, Messages, ModelInfo, open_engine

SHUT_DOWN_WAIT_MS = 10_000


class EngineClient(QObject):
    sig_load_requested = Signal(int, str, object)
    sig_generate_requested = Signal(int, object, object)
    sig_unload_requested = Signal()
    sig_reconfigure_requested = Signal(int, object)
    sig_shut_down_requested = Signal()

    def __init__(self, opener: EngineOpener = open_engine, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.worker = EngineWorker(opener)
        self._thread = QThread()
        self._thread.setObjectName("engine")
        self.worker.moveToThread(self._thread)
        self._ids = itertools.count(1)
        self.model: ModelInfo | None = None
        self.loading_id: int | None = None
        # Connected before anyone else, so this state is current when other receivers run.
        self.worker.sig_model_loaded.connect(self._on_loaded)
        self.worker.sig_load_failed.connect(self._on_load_failed)
        self.worker.sig_load_cancelled.connect(self._on_load_ended)
        self.worker.sig_model_unloaded.connect(self._on_unloaded)
        self.worker.sig_model_reconfigured.connect(self._on_reconfigured)
        self.worker.sig_reconfigure_failed.connect(self._on_reconfigure_failed)
        self.sig_load_requested.connect(self.worker.load)
        self.sig_generate_requested.connect(self.worker.generate)
        self.sig_unload_requested.connect(self.worker.unload)
        self.sig_reconfigure_requested.connect(self.worker.reconfigure)
        self.sig_shut_down_requested.connect(self.worker.shut_down)
        self._thread.start()

    @property
    def thread_running(self) -> bool:
        """Whether the engine's thread still runs (after ``shut_down``: it did not end in time)."""
        return self._thread.isRunning()

    @property
    def busy_loading(self) -> bool:
        return self.loading_id is not None

    def load(self, model: str, options: EngineOptions) -> int:
        self.cancel_load()
        long_lived.thaw()  # the model going may leave cycles among them: collected while the new one loads
        self.model = None
        self.loading_id = next(self._ids)
        # A copy, as for a reconfigure: the worker reads it for seconds while the settings may change.
        self.sig_load_requested.emit(self.loading_id, model, dataclasses.replace(options))
        return self.loading_id

    def cancel_load(self) -> None:
        """Give up the load asked for last, alone: a reply asked for before it, perhaps streaming
        while the load waits behind it, goes on."""
        if self.loading_id is not None:
            self.worker.cancel(self.loading_id)

    def generate(self, messages: Messages, sampling: SamplingSettings) -> int:
        request_id = next(self._ids)
        self.sig_generate_requested.emit(request_id, messages, sampling)
        return request_id

    def cancel(self, request_id: int) -> None:
        self.worker.cancel(request_id)

    def reconfigure(self, options: EngineOptions) -> int:
        """Resize the cache, or change its policy or link, after any running reply ends."""
        request_id = next(self._ids)
        # A copy: the settings go on changing on this thread.
        self.sig_reconfigure_requested.emit(request_id, dataclasses.replace(options))
        return request_id

    def unload(self) -> None:
        self.cancel_load()
        long_lived.thaw()
        # Gone for every request sent from now on, as load() does: a reply asked for before the
        # worker confirms must load the model again, not find it missing.
        self.model = None
        self.sig_unload_requested.emit()

    def shut_down(self) -> bool:
        """Stop what runs, release the model and end the thread; False if it did not end in time."""
        if not self._thread.isRunning():
            return True
        self.worker.cancel_through(next(self._ids))
        self.sig_shut_down_requested.emit()
        return self._thread.wait(SHUT_DOWN_WAIT_MS)

    @Slot(int, object)
    def _on_loaded(self, request_id: int, info: ModelInfo) -> None:
        if request_id == self.loading_id:
            self.loading_id, self.model = None, info
        long_lived.settle()

    @Slot(int)
    def _on_load_ended(self, request_id: int) -> None:
        if request_id == self.loading_id:
            self.loading_id = None

    @Slot(int, str, object)
    def _on_load_failed(self, request_id: int, _reason: str, kept: ModelInfo | None) -> None:
        if request_id == self.loading_id:
            self.loading_id, self.model = None, kept

    @Slot(int, object)
    def _on_reconfigured(self, _request_id: int, info: ModelInfo) -> None:
        if self.model is not None:
            self.model = info

    @Slot(int, str, object)
    def _on_reconfigure_failed(self, request_id: int, _reason: str, info: ModelInfo) -> None:
        self._on_reconfigured(request_id, info)

    @Slot()
    def _on_unloaded(self) -> None:
        self.model = None
        long_lived.settle()
