"""The engine worker with the fake engine failing where nothing else may: closing, decoding a
reply's tokens, building the old cache again. Whatever fails, the signal the GUI waits for still
comes, so its controls never stay stuck."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from seqmoe import BudgetTooSmall

from seqmoe_chat import worker as worker_module
from seqmoe_chat.engine_client import EngineClient
from seqmoe_chat.store import EngineOptions, SamplingSettings
from seqmoe_chat.worker import EngineWorker

from .fakes import FakeBackend, FakeEngine, FakeTokenizer

HI = [{"role": "user", "content": "Hi"}]


def close_failing(self: FakeEngine) -> None:
    raise RuntimeError("the fake engine could not close")


@pytest.fixture
def worker(backend: FakeBackend) -> EngineWorker:
    """On the test's thread: its signals arrive at once."""
    return EngineWorker(backend.open)


def needs_model(worker: EngineWorker) -> bool:
    """Whether the worker holds no model: a reply asked for now says it needs one."""
    asked: list[int] = []
    worker.sig_reply_needs_model.connect(asked.append)
    worker.generate(100, HI, SamplingSettings())
    worker.sig_reply_needs_model.disconnect(asked.append)
    return asked == [100]


def test_an_unload_is_confirmed_though_the_engine_fails_to_close(
    worker: EngineWorker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unloaded: list[bool] = []
    worker.sig_model_unloaded.connect(lambda: unloaded.append(True))
    worker.load(1, "", EngineOptions())
    monkeypatch.setattr(FakeEngine, "close", close_failing)
    worker.unload()
    assert unloaded == [True] and needs_model(worker)
    assert "closing the engine failed" in caplog.text


def test_loads_given_up_are_confirmed_though_the_engine_fails_to_close(
    worker: EngineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancelled: list[int] = []
    worker.sig_load_cancelled.connect(cancelled.append)
    cancel_at = {4: "Finding the model", 6: "Ready"}  # 6: after its last stage, the model is opened
    worker.sig_load_progressed.connect(
        lambda request_id, stage, _fraction: worker.cancel(request_id) if cancel_at.get(request_id) == stage else None)
    monkeypatch.setattr(FakeEngine, "close", close_failing)
    worker.load(1, "", EngineOptions())
    worker.cancel(2)
    worker.load(2, "", EngineOptions())  # given up before it started: the model loaded goes
    worker.load(3, "", EngineOptions())
    worker.load(4, "", EngineOptions())  # given up between two stages
    worker.load(6, "", EngineOptions())  # given up as it was opened: the engine opened goes
    assert cancelled == [2, 4, 6] and needs_model(worker)


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[EngineClient]:
    made = EngineClient(backend.open)
    yield made
    # Where shut_down failed: Qt aborts the process when a running thread is destroyed.
    made._thread.quit()
    made._thread.wait()


def test_the_engine_thread_ends_though_the_engine_fails_to_close(
    qtbot, client: EngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with qtbot.waitSignal(client.worker.sig_model_loaded, timeout=10_000):
        client.load("", EngineOptions())
    monkeypatch.setattr(FakeEngine, "close", close_failing)
    assert client.shut_down() and not client.thread_running


def test_a_reply_its_tokenizer_cannot_decode_fails_with_the_text_decoded_before(
    worker: EngineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode = FakeTokenizer.decode

    def decode_two_tokens_at_most(self: FakeTokenizer, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(token_ids) > 2:
            raise ValueError("a token id out of the vocabulary")
        return decode(self, token_ids, skip_special_tokens)

    monkeypatch.setattr(FakeTokenizer, "decode", decode_two_tokens_at_most)
    monkeypatch.setattr(worker_module, "STREAM_INTERVAL_S", 0.0)  # every token decoded as it comes
    failed: list[tuple[int, str, str]] = []
    worker.sig_reply_failed.connect(lambda *args: failed.append(args))
    worker.load(1, "", EngineOptions())
    worker.generate(2, HI, SamplingSettings())
    assert failed == [(2, "The engine failed unexpectedly (ValueError: a token id out of the vocabulary).", "You said: ")]


def test_a_cache_that_cannot_be_built_again_as_it_was_asks_for_a_reload(
    worker: EngineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def configure_out_of_memory(self: FakeEngine, policy: str = "lru", cache_ratio: float | None = None,
                                vram_budget_gb: float | None = None) -> None:
        self.policy_name = "none"  # as the engine's: the old cache goes before the new one is built
        raise BudgetTooSmall(f"the device ran out of memory for the {policy} cache")

    failed: list[tuple] = []
    worker.sig_reconfigure_failed.connect(lambda *args: failed.append(args))
    worker.load(1, "", EngineOptions())
    monkeypatch.setattr(FakeEngine, "configure", configure_out_of_memory)
    worker.reconfigure(2, EngineOptions(policy="gate"))
    ((request_id, reason, info),) = failed
    assert request_id == 2 and info.policy == "none"
    assert reason.startswith("the device ran out of memory for the gate cache\n\n")
    assert "cannot reply until it is loaded again: the device ran out of memory for the lru cache" in reason
