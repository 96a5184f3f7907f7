"""The engine: a loaded MoE model, its expert cache and generation with statistics.

Generation is transformers' own ``generate`` (same logits processing, stopping and
sampling as the reference model); the engine only replaces where expert weights come
from, by selecting the ``seqmoe`` experts implementation. The cache can be resized or
given another policy between two generations without reloading the model.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from . import experts as experts_impl
from .budget import (
    DEFAULT_CONTEXT_TOKENS,
    WORKSPACE_BYTES,
    CacheGeometry,
    budget_for_free_memory,
    context_held,
    kv_cache_bytes,
)
from .counts import is_count
from .cache import ExpertCache
from .errors import BudgetTooSmall, ModelCodeFailed, SeqMoEError
from .events import EventBus, TokenGenerated
from .kept_context import KeptContext
from .loader import LoadedModel
from .reply_text import ReplyText
from .routers import RouterLogits, router_logits
from .policies import (
    ORACLE_NEXT,
    ORACLES,
    POLICY_NAMES,
    FullPolicy,
    GatePolicy,
    LRUPolicy,
    OraclePolicy,
    Policy,
    RouterSeqMoEPolicy,
    SeqMoEPolicy,
)
from .predictor.calibration import find_predictor
from .predictor.model import ExpertPredictor, load_predictor
from .trace import model_identity
from .stats import GenerationStats
from .transfer import Copier, CudaCopier, EmulatedCopier, ExpertKey

PHASE_COUNTERS = (
    "h2d_bytes",
    "prefill_h2d_bytes",
    "decode_h2d_bytes",
    "prefill_hits",
    "prefill_late",
    "prefill_misses",
    "prefill_stall_seconds",
    "decode_hits",
    "decode_late",
    "decode_misses",
    "decode_stall_seconds",
    "prefetch_issued",
    "prefetch_unused",
)

DEFAULT_POLICY = "lru"
"""The policy of a cache that ``configure`` is not told otherwise about, and that a first reply
builds when nothing configured one."""
TEMPERATURES = (0.01, 100.0)
"""The sampling temperatures taken. Sampling is defined past both ends, up to where logits divided
by the temperature overflow, but below it is greedy decoding in all but name and above a uniform
draw: more likely a slip than a wish (the app's settings go from 0, greedy, to 2 in steps of 0.01)."""

SEEDS = 2**32
"""Seeds are below this: the CPU's generator keeps the low 32 bits of a seed, so two seeds that
differ only above them would give the same reply."""

# The engine whose cache serves each loaded model's experts, by the model's id: the experts modules
# are the model's, so a second engine's cache would serve the first's replies, and closing either
# would take the other's away. Weak: an engine dropped without ``close`` leaves the model free.
_SERVING: weakref.WeakValueDictionary[int, Engine] = weakref.WeakValueDictionary()
_SERVING_LOCK = threading.Lock()
_SERVED = "another engine uses this model's experts; close it first (one engine at a time per loaded model)"


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens. ``greedy`` ignores temperature and top-p. Frozen: its fields are
    checked once, when it is made."""

    max_new_tokens: int = 128
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.greedy, bool):  # "no" would be true
            raise SeqMoEError(f"greedy is True or False, not {self.greedy!r}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SeqMoEError(f"{name} is a number, not {value!r}")
        if not is_count(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SeqMoEError(f"at least one new token must be asked for, not {self.max_new_tokens}")
        if self.seed is not None and not (is_count(self.seed) and 0 <= self.seed < SEEDS):
            raise SeqMoEError(f"a seed is a whole number from 0 to 2**32 - 1, not {self.seed}")
        low, high = TEMPERATURES
        if not self.greedy and not low <= self.temperature <= high:
            raise SeqMoEError(f"a sampling temperature must be above 0 (0 is greedy decoding): "
                              f"from {low} to {high}, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SeqMoEError(f"top-p is a share of the probability mass, in (0, 1], not {self.top_p}")


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str  # the answer shown to the user: a harmony reply's final channel (reply_text)
    prompt_tokens: int
    stats: GenerationStats
    reasoning: str = ""  # a harmony reply's analysis channel


class Engine:
    """A loaded model, its expert cache and generation. It takes one call that generates or changes
    the cache at a time (another, from a thread or a callback, is refused), and a loaded model's
    experts are served by one engine's cache at a time (another engine is refused once one has a
    cache, until that one is closed)."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        link_gbps: float = 25.0,
        link_latency_us: float = 10.0,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        predictor_path: Path | None = None,
    ) -> None:
        _check_link(link_gbps, link_latency_us * 1e-6)
        if not is_count(context_tokens) or context_tokens < 2:
            raise SeqMoEError(f"a context holds at least a prompt token and a reply token, not {context_tokens} tokens")
        self.loaded = loaded
        self._refuse_if_served()
        self.context_tokens = context_held(context_tokens, loaded.context_limit)
        """Prompt and reply together; the KV cache for them is set aside in a VRAM budget."""
        self.events = EventBus()
        self.link_gbps = link_gbps
        self.link_setup: str | None = None
        """The consumer setup (``hardware.SETUPS``) whose copy-to-compute ratio ``bench.match_link``
        gave the emulated link's ``link_gbps``; ``None`` for a speed given directly."""
        self.link_latency_s = link_latency_us * 1e-6
        element = loaded.host.layout.dtype.itemsize
        self.geometry = CacheGeometry(
            total_experts=loaded.host.total_experts,
            bytes_per_expert=loaded.host.layout.bytes_per_expert,
            resident_bytes=loaded.resident_bytes,
            kv_bytes=kv_cache_bytes(loaded.config, self.context_tokens, element),
            workspace_bytes=WORKSPACE_BYTES[loaded.device.type] + loaded.host.unpack_bytes,
            top_k=loaded.top_k,
        )
        self.policy_name = "none"
        self.horizon: int | None = None
        """How many MoE layers ahead the ``seqmoe`` policy forecasts, at most its predictor's horizon
        (``None``: as far as the predictor sees). Read by ``configure``."""
        self._predictor_path = predictor_path
        self._loaded_predictor: ExpertPredictor | None = None
        self.cache: ExpertCache | None = None
        self._copier: Copier | None = None
        self._kept: KeptContext | None = None
        self._resident_accesses: torch.Tensor | None = None
        self._busy = threading.Lock()
        self._closed = False
        self._build_failed = False
        loaded.model.set_experts_implementation(experts_impl.IMPLEMENTATION)
        experts_impl.follow_decode_switch(
            loaded.model, loaded.experts, loaded.base_implementation, loaded.host.layout.bytes_per_expert
        )

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    @property
    def link(self) -> str:
        return "cuda" if self.device.type == "cuda" else "emulated"

    @property
    def cache_slots(self) -> int:
        return self.cache.size if self.cache is not None else self.geometry.total_experts

    @property
    def cached_experts(self) -> list[ExpertKey]:
        """The experts on the device now, or on their way there, as ``(layer, expert)``: the cache's
        (all of them under ``full``). Between generations, what ``configure`` or the last reply
        left there."""
        if self.cache is not None:
            return sorted(self.cache.pool.slot_of)
        if self.policy_name != "full":
            return []
        host = self.loaded.host
        return [(layer, expert) for layer in range(host.num_layers) for expert in range(host.layout.num_experts)]

    def free_memory_budget_gb(self) -> float | None:
        """On a CUDA device, the VRAM budget its free memory allows now (``budget_for_free_memory``:
        all that PyTorch holds in this process, weights, cache and freed blocks it keeps, and most
        of the free memory); ``None`` where there is no device memory to measure."""
        if self.device.type != "cuda":
            return None
        free, _total = torch.cuda.mem_get_info(self.device)
        return budget_for_free_memory(torch.cuda.memory_reserved(self.device), free) / 2**30

    def configure(
        self,
        policy: str = DEFAULT_POLICY,
        cache_ratio: float | None = None,
        vram_budget_gb: float | None = None,
        future: list[tuple[int, frozenset[int]]] | None = None,
    ) -> None:
        """Build the cache for ``policy`` at the given size (a ratio of all experts, or a budget),
        and fill it over the link with the experts the policy expects first (``ExpertCache.warm``).

        ``future`` is the oracle's knowledge: the (layer, experts) of every cache access of
        the same greedy run, recorded from ``LayerRouted`` events of a run at the same size.
        """
        with self._exclusive("configure the cache"):
            self._configure(policy, cache_ratio, vram_budget_gb, future)

    def _configure(
        self, policy: str, cache_ratio: float | None, vram_budget_gb: float | None, future: list[tuple[int, frozenset[int]]] | None
    ) -> None:
        slots = self._slots(cache_ratio, vram_budget_gb)
        if policy == "full" and slots < self.geometry.total_experts:
            need = self.geometry.budget_bytes_for(self.geometry.total_experts) / 2**30
            raise BudgetTooSmall(f"the full policy keeps all experts resident: it needs cache ratio 1 ({need:.2f} GiB)")
        # Before the policy is made: making one may run the model's own code (its routers).
        self._refuse_if_served()
        chosen = self._make_policy(policy, future)
        with _SERVING_LOCK:
            if _SERVING.setdefault(id(self.loaded.model), self) is not self:
                raise SeqMoEError(_SERVED)
        self._teardown()
        # A build that fails leaves no cache, and generate refuses until a configure succeeds: its
        # default for a new engine (every expert) may not fit the budget asked for, and building
        # the old cache again could fail as this one did (out of memory). The app's worker
        # configures the old one again itself.
        self._build_failed = True
        try:
            self._build(policy, chosen, slots)
        except BaseException as error:
            self._teardown()  # no cache half built, whose experts modules are not attached yet
            if isinstance(error, torch.OutOfMemoryError):
                raise BudgetTooSmall(
                    f"the device ran out of memory for {slots} expert slots; choose a smaller VRAM budget or cache ratio"
                ) from None
            raise
        self._build_failed = False

    def resize(self, cache_ratio: float | None = None, vram_budget_gb: float | None = None) -> None:
        """Give the expert cache another size between two generations, keeping the policy, the
        model and the most recently used experts (no reload); slots left free are filled as
        ``configure`` fills them."""
        with self._exclusive("resize the cache"):
            self._resize(cache_ratio, vram_budget_gb)

    def _resize(self, cache_ratio: float | None, vram_budget_gb: float | None) -> None:
        slots = self._slots(cache_ratio, vram_budget_gb)
        if self.cache is None:
            raise SeqMoEError(
                "the full policy keeps every expert resident and has no cache to resize"
                if self.policy_name == "full"
                else "configure a policy before resizing its cache"
            )
        if slots == self.cache.size:
            return
        previous = self.cache.size
        try:
            self.cache.resize(slots)
        except torch.OutOfMemoryError:
            raise BudgetTooSmall(
                f"the device ran out of memory for {slots} expert slots; the cache keeps its {previous} slots"
            ) from None
        try:
            self.cache.warm()
        except torch.OutOfMemoryError:
            raise BudgetTooSmall(
                f"the device ran out of memory filling the {slots} expert slots; choose a smaller VRAM budget or cache ratio"
            ) from None

    def _slots(self, cache_ratio: float | None, vram_budget_gb: float | None) -> int:
        if cache_ratio is not None and vram_budget_gb is not None:
            raise BudgetTooSmall("give either a cache ratio or a VRAM budget, not both")
        if vram_budget_gb is not None:
            if not math.isfinite(vram_budget_gb * 2**30):  # 1e300 GB is no number of bytes either
                raise BudgetTooSmall(f"the VRAM budget must be a number of GB, got {vram_budget_gb}")
            return self.geometry.slots_for_budget(int(vram_budget_gb * 2**30))
        return self.geometry.slots_for_ratio(1.0 if cache_ratio is None else cache_ratio)

    def _build(self, policy: str, chosen: Policy, slots: int) -> None:
        base = self.loaded.base_implementation
        if policy == "full":
            self._resident_accesses = torch.zeros(2, dtype=torch.int64, device=self.device)
            for index, module in enumerate(self.loaded.experts):
                tensors = self.loaded.host.layer_on(index, self.device)
                runtime = experts_impl.ResidentLayer(tensors, experts_impl.base_implementation(module, base), self._resident_accesses)
                experts_impl.attach(module, runtime)
        else:
            self._copier = self._make_copier()
            self.cache = ExpertCache(self.loaded.host, slots, self.device, self._copier, chosen, self.events)
            self.cache.warm()
            for index, module in enumerate(self.loaded.experts):
                runtime = experts_impl.OffloadedLayer(
                    index, len(self.loaded.experts), self.cache, experts_impl.base_implementation(module, base)
                )
                experts_impl.attach(module, runtime)
        self.policy_name = policy

    def _make_policy(self, name: str, future: list[tuple[int, frozenset[int]]] | None) -> Policy:
        experts, layers, top_k = self.loaded.host.layout.num_experts, self.loaded.host.num_layers, self.loaded.top_k
        if name == "full":
            return FullPolicy(layers, experts)
        if name == "lru":
            return LRUPolicy(layers, experts)
        if name == "gate":
            return GatePolicy(self._look_ahead, experts, top_k)
        if name == "seqmoe":
            predictor = self.predictor()
            if predictor is None:
                return RouterSeqMoEPolicy(self._look_ahead, experts, top_k)
            prior = predictor.config.prior()
            reuse = predictor.reuse.later_values if predictor.reuse is not None else None
            horizon = self._horizon_within(predictor.config.horizon)
            return SeqMoEPolicy(predictor.predict, layers, prior, horizon=horizon, reuse=reuse)
        if name in ORACLES:
            if future is None:
                raise SeqMoEError(f"the {name} policy needs the recorded future of the same run (seqmoe bench records it)")
            lookahead = layers if name == ORACLE_NEXT else None
            return OraclePolicy(future, layers, experts, lookahead=lookahead)
        raise SeqMoEError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")

    @cached_property
    def _look_ahead(self) -> list[RouterLogits]:
        """Each MoE layer's router as the look-ahead applies it; found, and each block tried, once
        for the model, not at every ``configure`` (the bench configures for each run)."""
        return router_logits(self.loaded)

    @property
    def forecast_horizon(self) -> int | None:
        """How many MoE layers ahead the configured policy forecasts (``None``: it does not)."""
        if self.policy_name == "gate":
            return 1
        if self.policy_name != "seqmoe":
            return None
        return self._horizon_within(self.max_horizon())

    def _horizon_within(self, limit: int) -> int:
        """``horizon`` as far as ``limit`` (the predictor's) allows; all of it for ``None``."""
        horizon = self.horizon
        if horizon is None:
            return limit
        if not is_count(horizon) or horizon < 1:
            raise SeqMoEError(f"the forecast horizon is a number of MoE layers, at least 1, not {horizon!r}")
        return min(horizon, limit)

    def max_horizon(self) -> int:
        """The farthest the ``seqmoe`` policy can forecast: its predictor's horizon, or one layer with
        the router fallback."""
        predictor = self.predictor()
        return predictor.config.horizon if predictor is not None else 1

    @property
    def predictor_path(self) -> Path | None:
        """The predictor file the ``seqmoe`` policy uses (``None``: none found yet)."""
        return self._predictor_path

    @predictor_path.setter
    def predictor_path(self, path: Path | None) -> None:
        self._predictor_path, self._loaded_predictor = path, None

    def predictor(self) -> ExpertPredictor | None:
        """The trained predictor for this model (given, or found in the user cache or resources), if any."""
        # While none is found, look again each time: a calibration (the app runs it beside the
        # engine) may have stored one since.
        if self._predictor_path is None:
            self._predictor_path = find_predictor(self.loaded)
        if self._predictor_path is None:
            return None
        if self._loaded_predictor is None:
            self._loaded_predictor = load_predictor(self._predictor_path, model_identity(self.loaded), self.device)
        return self._loaded_predictor

    def encode(self, prompt: str, chat: bool) -> list[int]:
        """Token ids of ``prompt``, as plain text or as one user turn of the chat template."""
        if chat:
            return self.encode_messages([{"role": "user", "content": prompt}])
        _check_text(prompt)
        return self.loaded.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``role``/``content`` dicts) through the model's chat template,
        ending with the prompt for the assistant's next turn. A template without a system role
        (Gemma 2's, the first Mixtral's) gets the system prompt at the head of the first user
        turn, where those models take their instructions."""
        tokenizer = self.loaded.tokenizer
        self.loaded.check_chat_template()
        for message in messages:
            _check_text(message["content"])
        attempts = [messages]
        folded = _system_in_first_user_turn(messages)
        if folded is not None:
            attempts.append(folded)
        refusal: Exception | None = None
        for attempt in attempts:
            try:
                ids = tokenizer.apply_chat_template(attempt, add_generation_prompt=True, tokenize=True, return_dict=False)
            except Exception as error:  # templates raise their own errors, e.g. on an unsupported role
                refusal = error  # the last: what still stops the conversation once the system prompt is folded
                continue
            return list(ids)
        raise SeqMoEError(f"the chat template of {self.loaded.name} rejected the conversation: {refusal}")

    @property
    def context_at_model_limit(self) -> bool:
        """Whether the model's own limit, not the context asked for, sets the context."""
        return self.context_tokens == self.loaded.context_limit

    def reply_room(self, prompt_ids: list[int]) -> int:
        """How many tokens a reply to ``prompt_ids`` can have before the context is full."""
        room = self.context_tokens - len(prompt_ids)
        if room < 1:
            why = ("the model's limit" if self.context_at_model_limit
                   else "as set; a longer context sets aside more memory for its KV cache")
            raise SeqMoEError(f"the prompt is {len(prompt_ids)} tokens, and the context holds "
                              f"{self.context_tokens} ({why}): shorten it")
        return room

    def generate(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        on_token: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        keep_context: bool = False,
    ) -> GenerationResult:
        """Continue ``prompt_ids``. With ``keep_context`` (a chat's turns), the KV cache of the
        previous generation, if that one kept it too, serves the prompt's tokens it holds, and
        this generation's is kept for the next (``kept_context.KeptContext``); any other call
        forgets it."""
        if not prompt_ids:
            raise SeqMoEError("the prompt is empty: there is nothing to continue")
        vocabulary = self.loaded.model.get_input_embeddings().num_embeddings
        if not all(isinstance(token, int) and 0 <= token < vocabulary for token in prompt_ids):
            raise SeqMoEError(f"the prompt must be token ids from 0 to {vocabulary - 1} (the model's vocabulary)")
        with self._exclusive("generate another reply"):
            return self._generate(prompt_ids, sampling, on_token, should_stop, keep_context)

    def _generate(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        on_token: Callable[[int], None] | None,
        should_stop: Callable[[], bool] | None,
        keep_context: bool,
    ) -> GenerationResult:
        room = self.reply_room(prompt_ids)
        if self.policy_name == "none":
            if self._build_failed:
                raise SeqMoEError("the last configure failed and left no cache; configure one before generating")
            self._configure(DEFAULT_POLICY, None, None, None)  # as configure() with no arguments
        kept, self._kept = self._kept, None
        reused = kept.reuse_for(prompt_ids) if kept is not None and keep_context else 0
        before = self._counters()
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        streamer = _Streamer(self.events, on_token)
        inputs = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        stopping = StoppingCriteriaList([_StopFlag(should_stop)]) if should_stop else None
        tokenizer = self.loaded.tokenizer
        start = time.perf_counter()
        streamer.start = start
        output = None
        try:
            with experts_impl.stoppable_prefill(self.loaded.experts, should_stop):
                output = self.loaded.model.generate(
                    inputs,
                    attention_mask=torch.ones_like(inputs),
                    max_new_tokens=min(sampling.max_new_tokens, room),
                    do_sample=not sampling.greedy,
                    temperature=None if sampling.greedy else sampling.temperature,
                    top_p=None if sampling.greedy else sampling.top_p,
                    top_k=None,
                    streamer=streamer,
                    stopping_criteria=stopping,
                    cache=kept.cache if reused else None,
                    return_dict_in_generate=True,
                    **_one_token_a_step(),
                    pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
                )
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - start
        except experts_impl.StoppedInPrefill:
            seconds = time.perf_counter() - start  # no token yet: the reply is empty
        except torch.OutOfMemoryError:
            raise SeqMoEError(
                f"the {self.device.type} ran out of memory while generating; choose a smaller VRAM budget"
            ) from None
        except Exception as error:
            if not _raised_in_transformers(error):
                raise
            text = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
            raise ModelCodeFailed(
                f"{type(self.loaded.model).__name__}'s code in transformers {transformers.__version__} failed while "
                f"generating ({type(error).__name__}: {text}); another transformers version may run this model"
            ) from error
        finally:
            # Also after a failure: copies queued for the failed reply's next layers are not needed.
            if self.cache is not None:
                self.cache.end_of_generation()
        after = self._counters()
        counts = {key: after[key] - before[key] for key in after}
        sequence = prompt_ids if output is None else output.sequences[0].tolist()
        token_ids = sequence[len(prompt_ids) :]
        if keep_context and output is not None:
            self._kept = KeptContext.after(output.cache, sequence)
        elif reused:
            # Stopped while reading the prompt: the turns before it, kept, need not be read again.
            kept.back_to_tokens()
            self._kept = kept
        stats = GenerationStats(
            tokens=len(token_ids),
            seconds=seconds,
            hits=counts["prefill_hits"] + counts["decode_hits"],
            late=counts["prefill_late"] + counts["decode_late"],
            misses=counts["prefill_misses"] + counts["decode_misses"],
            stall_seconds=counts["prefill_stall_seconds"] + counts["decode_stall_seconds"],
            **counts,
            cache_slots=self.cache_slots,
            total_experts=self.geometry.total_experts,
            policy=self.policy_name,
            device=str(self.device),
            link=self.link,
            link_setup=self.link_setup,
            link_gbps=self.link_gbps if self.link == "emulated" else None,
            bytes_per_copy=self.loaded.host.bytes_per_copy,
            prompt_tokens=len(prompt_ids),
            reused_prompt_tokens=reused,
            time_to_first_token=(streamer.first_token_at or seconds + start) - start,
            # Not a reply that ended itself with its last token.
            context_full=len(token_ids) == room < sampling.max_new_tokens and token_ids[-1] not in self.loaded.end_token_ids,
        )
        reply = ReplyText.of(tokenizer, token_ids)
        return GenerationResult(token_ids=token_ids, text=reply.text(), prompt_tokens=len(prompt_ids), stats=stats,
                                reasoning=reply.reasoning())

    def close(self) -> None:
        """Give the cache back and leave the model free for another engine; this one takes no more
        calls that generate or change the cache. Closing it again does nothing."""
        if self._closed:
            return
        with self._exclusive("close the engine"):
            self._closed = True
            self._kept = None
            if _SERVING.get(id(self.loaded.model)) is self:
                self._teardown()
                del _SERVING[id(self.loaded.model)]

    def _refuse_if_served(self) -> None:
        """Refuse when another engine's cache serves this model's experts."""
        if _SERVING.get(id(self.loaded.model)) not in (None, self):
            raise SeqMoEError(_SERVED)

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """Run the block as the only call at work on the open engine: one that generates or
        changes the cache."""
        # Refused rather than waited for. From a token callback, say, the call would wait for its
        # own reply; and from another thread it would change the cache under the reply under way,
        # which would go on with another cache, or none, and mix two caches' counters.
        if not self._busy.acquire(blocking=False):
            raise SeqMoEError(f"cannot {what} while a reply is generated or the cache is changed; do it after")
        try:
            if self._closed:
                raise SeqMoEError(f"cannot {what}: the engine is closed")
            yield
        finally:
            self._busy.release()

    def _counters(self) -> dict[str, float]:
        """Cumulative cache counters, by phase where they are split."""
        if self._resident_accesses is not None:
            counts = dict.fromkeys(PHASE_COUNTERS, 0)
            counts["prefill_hits"], counts["decode_hits"] = self._resident_accesses.tolist()
            return counts
        assert self.cache is not None and self._copier is not None
        counts: dict[str, float] = {"h2d_bytes": self._copier.bytes_copied}
        for phase, counter in self.cache.phases.items():
            counts[f"{phase}_hits"] = counter.hits
            counts[f"{phase}_late"] = counter.late
            counts[f"{phase}_misses"] = counter.misses
            counts[f"{phase}_h2d_bytes"] = counter.copied_bytes
            counts[f"{phase}_stall_seconds"] = self._copier.stall_seconds(phase)
        prefetches = self.cache.prefetches
        counts.update(prefetch_issued=prefetches.copied, prefetch_unused=prefetches.unused)
        return counts

    def _make_copier(self) -> Copier:
        if self.device.type == "cuda":
            return CudaCopier(self.device)
        _check_link(self.link_gbps, self.link_latency_s)  # both may have been set since
        return EmulatedCopier(self.link_gbps, self.link_latency_s)

    def _teardown(self) -> None:
        for module in self.loaded.experts:
            experts_impl.attach(module, None)
        if self._copier is not None:
            self._copier.close()
        self._copier = None
        self.cache = None
        self._resident_accesses = None
        self.policy_name = "none"
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _raised_in_transformers(error: Exception) -> bool:
    """Whether the deepest frame of ``error`` that is transformers' or seqmoe's is transformers':
    the model's own code failed, not the engine's hooks it calls (frames of torch or of a caller's
    callback below either do not count)."""
    owners = {"transformers": Path(transformers.__file__).parent, "seqmoe": Path(__file__).parent}
    deepest = None
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename)
        deepest = next((name for name, folder in owners.items() if path.is_relative_to(folder)), deepest)
    return deepest == "transformers"


def _system_in_first_user_turn(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The conversation with its leading system message joined to the first user turn, if it has both."""
    if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
        return None
    first = {"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
    return [first, *messages[2:]]


class _Streamer(BaseStreamer):
    """Receives tokens from ``generate``: the first call carries the prompt, then one token per step."""

    def __init__(self, events: EventBus, on_token: Callable[[int], None] | None) -> None:
        self.events = events
        self.on_token = on_token
        self.prompt_seen = False
        self.count = 0
        self.start = 0.0
        self.first_token_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        for token_id in value.reshape(-1).tolist():
            if self.events.active:
                self.events.emit(TokenGenerated(self.count, token_id, now - self.start))
            self.count += 1
            if self.on_token is not None:
                self.on_token(token_id)

    def end(self) -> None:
        """Nothing to flush: tokens are delivered as they come."""


@cache
def _one_token_a_step() -> dict[str, object]:
    """The ``generate`` arguments that undo what a model's ``generation_config.json`` may set to
    decode otherwise than one greedy or sampled token a step (beam search, contrastive search,
    assisted decoding, DoLa), which the engine's stream and its reference do not do, or to compile
    the forward pass (transformers does when the cache asked for can be compiled, on a GPU with CUDA
    graphs), which chooses and copies experts on the host at every layer: those of the fields the
    installed transformers has."""
    plain = GenerationConfig()
    fields = {
        "num_beams": 1, "num_beam_groups": 1, "constraints": None, "force_words_ids": None, "penalty_alpha": None,
        "dola_layers": None, "prompt_lookup_num_tokens": None, "assistant_early_exit": None, "use_mtp": False,
        "disable_compile": True,
    }
    return {name: value for name, value in fields.items() if hasattr(plain, name)}


LINK_GBPS = (1e-4, 1e6)
"""The emulated link's speeds: a copy's wait is slept, and at 1e-300 GB/s its end was past what the
clock holds (an OverflowError), at 1e-9 GB/s hours a copy. The bench's links, set from a tiny
model's layer time, stay far inside."""
MAX_LINK_LATENCY_S = 1.0


def _check_link(gbps: float, latency_s: float) -> None:
    low, high = LINK_GBPS
    if not (low <= gbps <= high and 0 <= latency_s <= MAX_LINK_LATENCY_S):  # NaN fails every comparison
        raise SeqMoEError(f"the emulated link needs a speed above 0 GB/s (from {low:g} to {high:g}) and a latency of "
                          f"at least 0 µs (at most {MAX_LINK_LATENCY_S * 1e6:g}), not {gbps} GB/s and {latency_s * 1e6} µs")


def _check_text(text: str) -> None:
    """Refuse text the tokenizer cannot take in one line: on a lone surrogate it raises a TypeError.
    (The app's transcripts check the same on their own: they may not import the engine.)"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SeqMoEError("the prompt is not valid UTF-8 text: it holds a lone surrogate, as bytes that are not UTF-8 "
                          "become; give it as UTF-8") from None


class _StopFlag(StoppingCriteria):
    """Cooperative stop: checked after every token."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), bool(self.should_stop()), dtype=torch.bool, device=input_ids.device)
