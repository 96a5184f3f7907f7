"""The engine worker: the one object that owns the loaded model, on its own thread.

Every request carries an id. Cancelling marks every id up to the given one as
cancelled; the engine checks that flag after every token, and the loader between its
stages, so Stop takes effect within one token. The engine is imported on the worker
thread the first time a model loads, which keeps the window's start instant.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QThread, Signal, Slot
from seqmoe.reply_text import ReplyText

from .engine_import import import_engine
from .store import EngineOptions, SamplingSettings

if TYPE_CHECKING:
    from seqmoe import Engine
    from seqmoe.budget import CacheGeometry
    from seqmoe.events import Listener

log = logging.getLogger(__name__)

# How often streamed text crosses to the GUI thread; the chat re-renders at most every 50 ms anyway.
STREAM_INTERVAL_S = 0.03
LOADING_SHARE = 0.95
"""The share of the load bar for loading the model; the rest: matching the emulated link, building the cache."""

Progress = Callable[[str, float], None]
EngineOpener = Callable[[str, EngineOptions, Progress, Callable[[], None]], "Engine"]
"""Opens (model, options, progress, release): ``release`` is called once the model passed the
checks that take no memory, for the model loaded before to let go of it."""
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    device: str
    architecture: str
    policy: str
    cache_slots: int
    total_experts: int
    geometry: CacheGeometry | None = None
    num_layers: int = 0
    experts_per_layer: int = 0
    link: str = ""  # "cuda" or "emulated"
    link_gbps: float = 0.0  # the emulated link's speed
    predictor_horizon: int | None = None  # MoE layers the policy forecasts ahead; None: it does not forecast
    max_horizon: int = 1  # the farthest the seqmoe policy can forecast with this model's predictor
    context_tokens: int = 0  # prompt and reply, as the engine holds them (the setting, capped at the model's limit)
    context_limit: int | None = None  # the model's own, when its config says
    link_setup: str | None = None  # the consumer setup the emulated link was matched to; None: a fixed speed
    bytes_per_copy: float = 0.0  # what one expert's copy moves over the link, on average (packed experts: less than a slot)
    cached: tuple[tuple[int, int], ...] = ()  # (layer, expert) in the cache when loaded or reconfigured (configure fills it)


@dataclass(frozen=True)
class ReplyResult:
    text: str
    model_id: str
    stopped: bool
    stats: dict[str, Any] = field(default_factory=dict)


class LoadCancelled(Exception):
    """Raised from the loader's progress callback to abandon a load."""


def open_engine(model: str, options: EngineOptions, on_progress: Progress, release: Callable[[], None] | None = None) -> Engine:
    """Load ``model`` (empty: the bundled demo model) and build its expert cache; ``release`` as the
    loader's ``on_checked``."""
    import_engine()
    from seqmoe import Engine, load_model
    from seqmoe.resources import demo_model_dir

    def loading(stage: str, fraction: float) -> None:
        if fraction < 1.0:  # the model is ready once its link is set and its cache built, below
            on_progress(stage, LOADING_SHARE * fraction)

    loaded = load_model(model or str(demo_model_dir()), device=options.device, on_progress=loading, on_checked=release,
                        for_chat=True)
    engine = Engine(loaded, link_gbps=options.link_gbps, context_tokens=options.context_tokens)
    engine.horizon = options.horizon
    try:
        set_link(engine, options, on_progress)
        engine.configure(options.policy, **options.cache_size(engine.free_memory_budget_gb()))
        on_progress("Ready", 1.0)
    except BaseException:
        engine.close()
        raise
    return engine


def set_link(engine: Engine, options: EngineOptions, on_progress: Progress) -> None:
    """The emulated link at the options' fixed speed, or matched to their setup: a short timed
    run of ``full`` sets the speed at which one expert copy takes as many layers of decode as
    on that setup. Where the timing runs had no decode to time (a model that ended both replies
    at once) the link keeps the fixed speed, as the note in the settings then says. A CUDA
    device's link is real, and left alone."""
    if engine.link != "emulated":
        return
    from seqmoe import SeqMoEError
    from seqmoe.bench import match_link

    engine.link_gbps, engine.link_setup = options.link_gbps, None
    setup = link_setup(options)
    if setup is None:
        return
    on_progress("Timing decode to match the emulated link to the setup", LOADING_SHARE)
    try:
        match_link(engine, setup)
    except SeqMoEError as error:
        log.warning("the emulated link stays at %s GB/s: %s", options.link_gbps, error)


def link_setup(options: EngineOptions) -> str | None:
    """The options' setup, None for a fixed speed; one this version does not know (settings of a
    later one) is the default."""
    from seqmoe.hardware import DEFAULT_SETUP, SETUPS

    if options.link_setup is None:
        return None
    return options.link_setup if options.link_setup in SETUPS else DEFAULT_SETUP


def link_changed(info: ModelInfo, options: EngineOptions) -> bool:
    """Whether ``options`` ask the loaded model's emulated link for another speed or setup."""
    if info.link != "emulated":
        return False
    setup = link_setup(options)
    return setup != info.link_setup or (setup is None and options.link_gbps != info.link_gbps)


def model_info(engine: Engine) -> ModelInfo:
    host = engine.loaded.host
    return ModelInfo(
        name=engine.loaded.name,
        path=str(engine.loaded.path),
        device=str(engine.device),
        architecture=engine.loaded.architecture,
        policy=engine.policy_name,
        cache_slots=engine.cache_slots,
        total_experts=engine.geometry.total_experts,
        geometry=engine.geometry,
        num_layers=host.num_layers,
        experts_per_layer=host.layout.num_experts,
        link=engine.link,
        link_gbps=engine.link_gbps,
        link_setup=engine.link_setup,
        predictor_horizon=engine.forecast_horizon,
        max_horizon=engine.max_horizon(),
        context_tokens=engine.context_tokens,
        context_limit=engine.loaded.context_limit,
        bytes_per_copy=host.bytes_per_copy,
        cached=tuple(engine.cached_experts),
    )


def describe_error(error: BaseException) -> str:
    """One line for people. Engine errors already are; anything else is a bug worth its type."""
    from seqmoe import SeqMoEError

    if isinstance(error, SeqMoEError):
        return str(error)
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, MemoryError) or "out of memory" in text.lower():
        return "The computer ran out of memory; choose a smaller VRAM budget or a smaller model."
    return f"The engine failed unexpectedly ({type(error).__name__}: {text})."


class EngineWorker(QObject):
    sig_load_progressed = Signal(int, str, float)  # request id, stage, fraction
    sig_model_loaded = Signal(int, object)  # request id, ModelInfo
    sig_load_failed = Signal(int, str, object)  # request id, reason, ModelInfo of the model still loaded, or None
    sig_load_cancelled = Signal(int)
    sig_model_unloaded = Signal()
    sig_reply_streamed = Signal(int, str, int)  # request id, text so far, tokens so far
    sig_reply_finished = Signal(int, object)  # request id, ReplyResult
    sig_reply_failed = Signal(int, str, str)  # request id, reason, text so far
    sig_reply_needs_model = Signal(int)  # request id: its turn came with no model loaded
    sig_model_reconfigured = Signal(int, object)  # request id, ModelInfo
    sig_reconfigure_failed = Signal(int, str, object)  # request id, reason, ModelInfo as it is now

    def __init__(self, opener: EngineOpener = open_engine) -> None:
        super().__init__()
        self._open = opener
        self._engine: Engine | None = None
        self._info: ModelInfo | None = None
        # Written by the GUI thread, read here: an int assignment is atomic, and the set of single
        # cancels is changed under its lock (this thread drops the ones of requests handled).
        self._cancelled_through = 0
        self._cancelled_ids: set[int] = set()
        self._cancels_lock = threading.Lock()
        # Event listeners follow the engine across loads; the lock is held only to swap the
        # engine or a listener, never while the engine works.
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def watch_events(self, listener: Listener) -> None:
        """Subscribe ``listener`` to the engine's events, now and for every model loaded later.
        Safe from any thread, also while a reply is generated."""
        with self._lock:
            self._listeners.append(listener)
            if self._engine is not None:
                self._engine.events.subscribe(listener)

    def unwatch_events(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.remove(listener)
            if self._engine is not None:
                self._engine.events.unsubscribe(listener)

    def cancel(self, request_id: int) -> None:
        """Cancel ``request_id`` alone (a reply stopped: a load it waits for goes on). Safe to
        call from any thread."""
        with self._cancels_lock:
            self._cancelled_ids.add(request_id)

    def cancel_through(self, request_id: int) -> None:
        """Cancel ``request_id`` and every earlier request (a load given up, the app closing).
        Safe to call from any thread."""
        self._cancelled_through = max(self._cancelled_through, request_id)

    def _cancelled(self, request_id: int) -> bool:
        return request_id <= self._cancelled_through or request_id in self._cancelled_ids

    def _begin(self, request_id: int) -> None:
        """Forget the cancels of the requests before ``request_id``: requests arrive in the order of
        their ids, so those are handled (a Stop pressed as its reply ended would stay otherwise)."""
        with self._cancels_lock:
            self._cancelled_ids = {cancelled for cancelled in self._cancelled_ids if cancelled >= request_id}

    @Slot(int, str, object)
    def load(self, request_id: int, model: str, options: EngineOptions) -> None:
        """Replace the loaded model by ``model``. One refused by the checks that take no memory
        (no such folder, not an MoE, remote code) leaves the model loaded before as it was, and
        ``sig_load_failed`` says it stayed; after those checks it goes, to give its memory back.
        A load given up lets it go too: the app let it go when asking for this one."""
        self._begin(request_id)
        if self._cancelled(request_id):
            self._close()
            self.sig_load_cancelled.emit(request_id)
            return

        def progress(stage: str, fraction: float) -> None:
            if self._cancelled(request_id):
                raise LoadCancelled
            self.sig_load_progressed.emit(request_id, stage, fraction)

        try:
            engine = self._open(model, options, progress, self._close)
        except LoadCancelled:
            self._close()
            self.sig_load_cancelled.emit(request_id)
            return
        except Exception as error:  # the app must survive any failure to load
            if self._engine is not None:  # refused by its checks: the model loaded before stays, as it is now
                self._info = model_info(self._engine)
            self._load_failed(request_id, model, error)
            return
        if self._cancelled(request_id):
            _close_engine(engine)
            self.sig_load_cancelled.emit(request_id)
            return
        try:
            info = model_info(engine)
        except Exception as error:  # an engine that cannot describe itself is no use: it fails as a load
            _close_engine(engine)
            self._load_failed(request_id, model, error)
            return
        with self._lock:
            self._engine, self._info = engine, info
            for listener in self._listeners:
                engine.events.subscribe(listener)
        self.sig_model_loaded.emit(request_id, self._info)

    def _load_failed(self, request_id: int, model: str, error: Exception) -> None:
        """Say why ``model`` did not load, with the model that stays loaded, if any."""
        from seqmoe import BudgetTooSmall

        _log_unexpected(error, "loading %s failed", model or "the demo model")
        reason = describe_error(error)
        if isinstance(error, BudgetTooSmall):  # saved, it fails every start until changed: said where
            reason += "\n\nChange the VRAM budget in Settings ▸ Engine, then load the model again."
        self.sig_load_failed.emit(request_id, reason, self._info)

    @Slot(int, object)
    def reconfigure(self, request_id: int, options: EngineOptions) -> None:
        """Apply the policy, link speed and cache size of ``options`` to the loaded model without
        reloading it: a resize keeps the cached experts; another policy or link rebuilds the cache.
        Queued behind a running reply, so it takes effect between two generations."""
        engine, info = self._engine, self._info
        if engine is None or info is None:
            return  # the options apply when a model is next loaded
        before = (engine.policy_name, engine.link_gbps, engine.link_setup, engine.horizon, engine.cache_slots)
        relink = link_changed(info, options)
        try:
            if relink or (engine.policy_name, engine.horizon) != (options.policy, options.horizon):
                engine.horizon = options.horizon
                if relink:
                    set_link(engine, options, lambda _stage, _fraction: None)
                engine.configure(options.policy, **options.cache_size(engine.free_memory_budget_gb()))
            elif options.policy != "full":
                engine.resize(**options.cache_size(engine.free_memory_budget_gb()))
        except Exception as error:  # the model stays usable with the configuration it had
            _log_unexpected(error, "reconfiguring the cache failed")
            reason = describe_error(error)
            if (engine.policy_name, engine.link_gbps, engine.link_setup, engine.horizon) != before[:4]:
                reason += _restore(engine, before)
            self._info = model_info(engine)
            self.sig_reconfigure_failed.emit(request_id, reason, self._info)
            return
        self._info = model_info(engine)
        self.sig_model_reconfigured.emit(request_id, self._info)

    @Slot(int, object, object)
    def generate(self, request_id: int, messages: Messages, sampling: SamplingSettings) -> None:
        self._begin(request_id)
        if self._cancelled(request_id):
            return
        if self._engine is None or self._info is None:
            self.sig_reply_needs_model.emit(request_id)
            return
        engine = self._engine
        stream = ReplyText(engine.loaded.tokenizer)
        last_emit = 0.0
        decoded = ""  # the text last streamed: what a reply keeps whose tokens its tokenizer cannot decode

        def on_token(token_id: int) -> None:
            nonlocal last_emit, decoded
            stream.add(token_id)
            now = time.monotonic()
            if now - last_emit >= STREAM_INTERVAL_S:
                last_emit = now
                decoded = stream.text()
                self.sig_reply_streamed.emit(request_id, decoded, stream.count)

        try:
            prompt = _fit_context(engine, messages, sampling.max_new_tokens)
            result = engine.generate(
                prompt, _engine_sampling(sampling), on_token=on_token,
                should_stop=lambda: self._cancelled(request_id), keep_context=True,
            )
            # Its statistics too: a reply that cannot be finished must fail, not stream forever.
            reply = ReplyResult(result.text, self._info.name, self._cancelled(request_id), result.stats.as_dict())
        except Exception as error:  # a failed reply must leave the worker ready for the next
            _log_unexpected(error, "generation failed")
            self.sig_reply_failed.emit(request_id, describe_error(error), _text_or(stream, decoded))
            return
        self.sig_reply_finished.emit(request_id, reply)

    @Slot()
    def unload(self) -> None:
        self._close()
        self.sig_model_unloaded.emit()

    @Slot()
    def shut_down(self) -> None:
        """Release the model and end the thread's event loop (queued after any running request)."""
        self._close()
        QThread.currentThread().quit()

    def _close(self) -> None:
        with self._lock:
            engine, self._engine, self._info = self._engine, None, None
            if engine is not None:
                for listener in self._listeners:
                    engine.events.unsubscribe(listener)
        if engine is not None:
            # A closed engine leaves no reference cycle through its model, so its memory comes back
            # when ``engine`` goes, below. No gc.collect() here: on this thread it may finalise
            # the GUI's Qt objects and deadlock with the GUI thread.
            _close_engine(engine)


def _close_engine(engine: Engine) -> None:
    """Close ``engine``; a failure is only logged. The engine is dropped either way, and what
    follows the close must happen all the same: the GUI waits for the unload or the cancelled
    load to be confirmed, the app's quit for the thread to end. The worker has no signal for
    a failure outside a request, so the user hears nothing of it."""
    try:
        engine.close()
    except Exception:
        log.exception("closing the engine failed")


def _text_or(stream: ReplyText, fallback: str) -> str:
    """All of ``stream``'s text, or ``fallback`` where the tokenizer cannot decode it: a reply that
    failed in its tokenizer would fail here again, and its failure would never be reported."""
    try:
        return stream.text()
    except Exception:
        return fallback


def _log_unexpected(error: BaseException, message: str, *args: object) -> None:
    """Log ``error`` with its traceback unless it is the engine's own refusal, whose message says it all."""
    from seqmoe import SeqMoEError

    if not isinstance(error, SeqMoEError):
        log.exception(message, *args)


def _restore(engine: Engine, before: tuple) -> str:
    """Configure ``engine`` as ``before`` (policy, link speed, link setup, horizon, slots) after a
    change that failed; what to add to the failure's reason ("" when the old cache is back)."""
    engine.link_gbps, engine.link_setup, engine.horizon = before[1:4]
    try:
        engine.configure(before[0], cache_ratio=before[4] / engine.geometry.total_experts)
    except Exception as error:  # the engine is left without a cache: only a new load builds one
        _log_unexpected(error, "restoring the cache as it was failed")
        return ("\n\nRebuilding the previous cache failed too, so the model cannot reply until "
                f"it is loaded again: {describe_error(error)}")
    return ""


def _engine_sampling(settings: SamplingSettings):
    from seqmoe import Sampling
    from seqmoe.engine import TEMPERATURES

    # 0 is greedy; so is a stored value under the engine's least (a hand edit, an import), where
    # sampling is greedy decoding in all but name.
    greedy = settings.temperature < TEMPERATURES[0]
    return Sampling(
        max_new_tokens=settings.max_new_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed,
    )


def _fit_context(engine: Engine, messages: Messages, max_new_tokens: int) -> list[int]:
    """The prompt ids that leave room in the engine's context for some reply: the oldest turns
    after the system prompt are left out until the prompt and some reply fit. The engine stops
    a longer reply where the context is full, and says so."""
    limit = engine.context_tokens
    ids = engine.encode_messages(messages)
    reply_room = min(max_new_tokens, limit // 4)
    kept = list(messages)
    first = 1 if kept and kept[0]["role"] == "system" else 0
    while len(ids) + reply_room > limit and len(kept) - first > 1:
        del kept[first]
        while len(kept) - first > 1 and kept[first]["role"] != "user":
            del kept[first]
        ids = engine.encode_messages(kept)
    from seqmoe import SeqMoEError

    try:
        engine.reply_room(ids)  # refuses a prompt that alone fills the context
    except SeqMoEError as error:
        if engine.context_at_model_limit:
            raise
        raise SeqMoEError(f"{error}, or set a longer context in Settings ▸ Engine") from None
    return ids
