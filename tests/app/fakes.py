"""A fake engine for widget tests: the engine's public surface, word-sized tokens, and
knobs for speed, failures and slow loading. Replies are predictable: they echo the last
user message and contain a code block."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from seqmoe import ModelRefused, SeqMoEError
from seqmoe.budget import CacheGeometry
from seqmoe.events import EventBus
from seqmoe.hub_files import model_name

from seqmoe_chat.store import EngineOptions


def reply_for(messages: list[dict[str, str]]) -> str:
    last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return f"You said: {last}\n\n```python\nprint('hello')\n```\n\nThat is all."


class FakeTokenizer:
    """Each word with the white space after it is one token."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in re.findall(r"\S+\s*|\s+", text):
            self.pieces.append(piece)
            ids.append(len(self.pieces) - 1)
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in token_ids)


@dataclass
class FakeStats:
    tokens: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "time_to_first_token": 0.01,
            "hits": 90,
            "misses": 10,
            "hit_rate": 0.9,
            "stall_seconds": 0.002,
            "device": "cpu",
            "policy": "lru",
        }


@dataclass
class FakeBackend:
    """What a test controls: how fast tokens come, when generation fails, how loading goes."""

    token_delay_s: float = 0.0
    repeat: int = 1  # the reply text is repeated this many times (for long replies)
    fail_after: int | None = None  # tokens before generation raises
    failure: BaseException = field(default_factory=lambda: RuntimeError("the fake engine broke"))
    load_delay_s: float = 0.0  # per loading stage
    refuse: set[str] = field(default_factory=lambda: {"broken"})  # refused by the checks: the model loaded stays
    fail_late: set[str] = field(default_factory=lambda: {"too-big"})  # fail after the model loaded went
    prompts: list[list[dict[str, str]]] = field(default_factory=list)
    samplings: list[Any] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # perf_counter() of every token produced
    engines: list[FakeEngine] = field(default_factory=list)
    options: list[EngineOptions] = field(default_factory=list)  # as every load was given them

    def open(self, model: str, options: EngineOptions, on_progress, release) -> FakeEngine:
        self.options.append(options)
        for fraction, stage in ((0.0, "Finding the model"), (0.5, "Loading the weights"), (1.0, "Ready")):
            time.sleep(self.load_delay_s)
            on_progress(stage, fraction)
        if model in self.refuse:
            raise ModelRefused(f"{model} is not a Mixture-of-Experts model")
        release()
        if model in self.fail_late:
            raise ModelRefused(f"{model}'s weights do not fit in RAM")
        engine = FakeEngine(self, model or "seqmoe-demo")
        engine.link_setup = options.link_setup  # as if matched (no timing runs: the fake has no decode to time)
        self.engines.append(engine)
        return engine


class FakeEngine:
    def __init__(self, backend: FakeBackend, name: str) -> None:
        self.backend = backend
        self.loaded = SimpleNamespace(
            tokenizer=FakeTokenizer(),
            path=Path("/models") / name,
            name=model_name(Path("/models") / name),
            architecture="FakeMoeForCausalLM",
            host=SimpleNamespace(num_layers=2, layout=SimpleNamespace(num_experts=12), bytes_per_copy=0.75 * 2**20),
            context_limit=32768,
        )
        self.device = "cpu"
        self.link = "emulated"
        self.link_gbps = 25.0
        self.link_setup: str | None = None
        self.policy_name = "lru"
        self.context_tokens = 4096
        self.context_at_model_limit = False
        self.horizon: int | None = None
        self.cache_slots = 11
        self.geometry = CacheGeometry(total_experts=24, bytes_per_expert=2**20, resident_bytes=2**24, kv_bytes=2**22,
                                      workspace_bytes=2**26, top_k=2)
        self.events = EventBus()
        self.closed = False

    @property
    def cached_experts(self) -> list[tuple[int, int]]:
        return [(layer, 0) for layer in range(2)] if self.policy_name == "seqmoe" else []  # as if its prior filled them

    @property
    def forecast_horizon(self) -> int | None:
        return {"gate": 1, "seqmoe": 1}.get(self.policy_name)

    def max_horizon(self) -> int:
        return 1  # no predictor: the router fallback looks one layer ahead

    def free_memory_budget_gb(self) -> float | None:
        return None  # a CPU engine: no device memory to size the cache to

    def configure(self, policy: str = "lru", cache_ratio: float | None = None, vram_budget_gb: float | None = None) -> None:
        self.policy_name = policy
        self.resize(cache_ratio, vram_budget_gb)

    def resize(self, cache_ratio: float | None = None, vram_budget_gb: float | None = None) -> None:
        if vram_budget_gb is not None:
            self.cache_slots = self.geometry.slots_for_budget(int(vram_budget_gb * 2**30))
        else:
            self.cache_slots = self.geometry.slots_for_ratio(1.0 if cache_ratio is None else cache_ratio)

    def reply_room(self, prompt_ids: list[int]) -> int:
        room = self.context_tokens - len(prompt_ids)
        if room < 1:
            raise SeqMoEError(f"the prompt is {len(prompt_ids)} tokens, and the context holds {self.context_tokens}")
        return room

    def encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        if not messages or messages[-1]["role"] != "user":
            raise SeqMoEError("the conversation must end with a user message")
        self.backend.prompts.append(messages)
        return list(range(sum(len(m["content"]) for m in messages)))

    def generate(self, prompt_ids, sampling, on_token=None, should_stop=None, keep_context=False) -> SimpleNamespace:
        backend = self.backend
        backend.samplings.append(sampling)
        text = "\n\n".join([reply_for(backend.prompts[-1])] * backend.repeat)
        ids = self.loaded.tokenizer.encode(text)
        start = time.perf_counter()
        produced: list[int] = []
        for token_id in ids:
            if backend.fail_after is not None and len(produced) >= backend.fail_after:
                raise backend.failure
            time.sleep(backend.token_delay_s)
            produced.append(token_id)
            backend.token_times.append(time.perf_counter())
            if on_token is not None:
                on_token(token_id)
            if should_stop is not None and should_stop():
                break
        seconds = time.perf_counter() - start
        return SimpleNamespace(
            token_ids=produced,
            text=self.loaded.tokenizer.decode(produced),
            prompt_tokens=len(prompt_ids),
            stats=FakeStats(len(produced), max(seconds, 1e-6)),
        )

    def close(self) -> None:
        self.closed = True
