"""Trace-driven simulation: replay recorded routing through the real cache and policies
on a virtual clock, with the costs of a named GPU, link and model shape.

The same ``ExpertCache``, scheduler and policies as at run time make every decision; only
time is modelled: a decode layer computes in ``layer_bytes / memory bandwidth`` (decode is
memory-bandwidth bound; ``Hardware.at_efficiency`` models an engine reaching only part of it), a copy takes ``latency + copy_bytes / link bandwidth`` on one
lane, and compute waits for a missing expert. Routing comes from the trace, so a trace of
a small model stands in for the routing of a large one, whose byte sizes come from the
model shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .bound import Access, CopyBound, fewest_copies
from .budget import minimum_slots, ratio_slots, too_few_slots
from .cache import ExpertCache
from .compression import RawExpert
from .errors import BudgetTooSmall, SeqMoEError
from .events import EventBus
from .hardware import Hardware, ModelShape
from .policies import ORACLE_NEXT, ORACLES, GatePolicy, LRUPolicy, OraclePolicy, Policy, RouterSeqMoEPolicy, SeqMoEPolicy
from .predictor.model import ExpertPredictor
from .routers import RouterLogits
from .stats import hits_share, late_share
from .store import ExpertLayout
from .trace import Traces, document_runs
from .transfer import CopyJob, ExpertKey, ModelledLane


SIMULATED_POLICIES = ("lru", "gate", "seqmoe", *ORACLES)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedCopier(ModelledLane):
    """One copy lane on the virtual clock; the same contract as the real copiers (the bytes
    move when a copy ends, so a slot holds its expert once it is ready)."""

    link = "simulated"

    def __init__(self, clock: VirtualClock, seconds_per_copy: float, expert_bytes: int) -> None:
        super().__init__(clock)
        self.clock: VirtualClock = clock
        self.copy_seconds = seconds_per_copy
        self.expert_bytes = expert_bytes

    def seconds_per_copy(self, nbytes: int) -> float:
        return self.copy_seconds

    def _lane_seconds(self, job: CopyJob) -> float:
        return self.copy_seconds

    def _lane_bytes(self, job: CopyJob) -> int:
        return self.expert_bytes

    def _pass_until(self, when: float) -> None:
        self.clock.now = when


class _NoWeights:
    """A host store with the right shape for the slot table and no weights to copy."""

    bytes_per_copy = 0

    def __init__(self, layers: int, experts: int) -> None:
        self.layout = ExpertLayout(("none",), ((0,),), torch.float16, experts)
        self.num_layers = layers
        self.total_experts = layers * experts

    def expert(self, key: ExpertKey) -> RawExpert:
        return RawExpert(())


@dataclass
class SimulationResult:
    policy: str
    cache_ratio: float
    cache_slots: int
    decode_tokens: int
    seconds: float
    full_seconds: float
    hits: int
    late: int
    misses: int
    stall_seconds: float
    h2d_bytes: int
    prefetch_issued: int
    prefetch_unused: int
    prefill_seconds: float
    prefill_full_seconds: float
    """The prompts' compute alone: ``prefill_seconds`` with every expert resident."""

    def as_dict(self) -> dict[str, object]:
        tokens = max(self.decode_tokens, 1)
        return {
            "policy": self.policy,
            "cache_ratio": self.cache_ratio,
            "cache_slots": self.cache_slots,
            "tokens": self.decode_tokens,
            "tokens_per_s": self.decode_tokens / self.seconds if self.seconds else 0.0,
            "ratio_to_full": self.full_seconds / self.seconds if self.seconds else 1.0,
            "hit_rate": hits_share(self.hits, self.late, self.misses, empty=1.0),
            "late_rate": late_share(self.hits, self.late, self.misses, empty=0.0),
            "stall_seconds_per_token": self.stall_seconds / tokens,
            "h2d_bytes_per_token": self.h2d_bytes / tokens,
            "unused_prefetch_fraction": self.prefetch_unused / self.prefetch_issued if self.prefetch_issued else 0.0,
            "prefill_seconds": self.prefill_seconds,
            "prefill_ratio_to_full": self.prefill_full_seconds / self.prefill_seconds if self.prefill_seconds else 1.0,
        }


@dataclass(frozen=True)
class Step:
    """One cache access as the engine makes it: a layer (or a group of its experts, when a
    prefill chunk needs more than the cache holds) of one prefill chunk or decode token."""

    layer: int
    experts: tuple[int, ...]
    token: int | None
    """The decode token, or ``None`` in prefill."""
    last_token: int
    """The run's last token (a decode token is its own): the one whose state policies read."""
    whole: bool
    """All the layer's experts fit the cache at once; only then does the engine look ahead from
    it in prefill (stream the next layer, let the policy look past the prompt)."""


def replay_steps(traces: Traces, slots: int) -> list[Step]:
    """Every cache access of the recorded run, in execution order: each document's runs (see
    ``trace.document_runs``), a prefill layer split into groups when it needs more than ``slots``."""
    layers = traces.experts.shape[1]
    steps = []
    for _, runs in document_runs(traces):
        for run in runs:
            if run.decode:
                token = int(run.tokens[0])
                routed = (sorted(set(traces.experts[token, layer].tolist())) for layer in range(layers))
                steps.extend(Step(layer, tuple(experts), token, token, True) for layer, experts in enumerate(routed))
                continue
            last_token = int(run.tokens[-1])
            for layer in range(layers):
                needed = sorted(set(traces.experts[run.tokens, layer].reshape(-1).tolist()))
                for start in range(0, len(needed), slots):
                    steps.append(Step(layer, tuple(needed[start : start + slots]), None, last_token, len(needed) <= slots))
    return steps


def simulate(
    traces: Traces,
    policy_name: str,
    cache_ratio: float,
    hardware: Hardware,
    shape: ModelShape,
    predictor: ExpertPredictor | None = None,
    routers: list[RouterLogits] | None = None,
) -> SimulationResult:
    """Replay each document of ``traces``, its prefill chunks then its decode tokens, through the
    cache, as the engine would run them; decode figures are reported. ``gate`` needs the traced
    model's ``routers``, and so does ``seqmoe`` without a ``predictor``, as the engine runs it then."""
    require_decode_tokens(traces)
    layers, experts = traces.experts.shape[1], traces.probs.shape[-1]
    host = _NoWeights(layers, experts)
    slots = cache_slots(traces, cache_ratio)
    clock = VirtualClock()
    copier = SimulatedCopier(clock, hardware.copy_seconds(shape), shape.copy_bytes)
    steps = replay_steps(traces, slots)
    policy = _policy(policy_name, traces, steps, predictor, routers)
    cache = ExpertCache(host, slots, torch.device("cpu"), copier, policy, EventBus(), clock=clock)
    cache.warm()  # as the engine's configure does
    layer_seconds = hardware.layer_seconds(shape)
    decode_seconds = prefill_seconds = prefill_full_seconds = 0.0
    decode_layers = decode_bytes = 0
    previous: Step | None = None
    for step in steps:
        if previous is not None and previous.token is not None and step.token is None:
            cache.end_of_generation()  # a new document begins
        previous = step
        decode = step.token is not None
        began, copied = clock.now, copier.bytes_copied

        def look_ahead() -> None:  # as the engine does, once the layer's misses are on their way
            if decode:
                forecasts = policy.forecast(step.layer, traces.hidden[step.token, step.layer].float(), torch.tensor(step.experts))
                if forecasts:
                    cache.plan(forecasts)
            elif step.whole:
                policy.look_past_prompt(step.layer, traces.hidden[step.last_token, step.layer].float(), traces.experts[step.last_token, step.layer])
                if policy.streams_prefill and step.layer + 1 < layers:
                    cache.stream(step.layer + 1, policy.stream_order(step.layer + 1))

        held = cache.acquire(step.layer, step.experts, prefill=not decode, meanwhile=look_ahead)
        if decode:
            clock.now += layer_seconds
            decode_seconds += clock.now - began
            decode_bytes += copier.bytes_copied - copied
            decode_layers += 1
        else:
            compute = (shape.attention_bytes + len(step.experts) * shape.expert_bytes) / hardware.memory_bytes_per_s
            clock.now += compute
            prefill_seconds += clock.now - began
            prefill_full_seconds += compute
        cache.release(held)
    counters = cache.phases["decode"]
    return SimulationResult(
        policy=policy_name,
        cache_ratio=cache_ratio,
        cache_slots=slots,
        decode_tokens=decode_layers // layers,
        seconds=decode_seconds,
        full_seconds=decode_layers * layer_seconds,
        hits=counters.hits,
        late=counters.late,
        misses=counters.misses,
        stall_seconds=copier.stall_seconds("decode"),
        h2d_bytes=decode_bytes,
        prefetch_issued=cache.prefetches.copied,
        prefetch_unused=cache.prefetches.unused,
        prefill_seconds=prefill_seconds,
        prefill_full_seconds=prefill_full_seconds,
    )


def require_decode_tokens(traces: Traces) -> None:
    """Refuse traces without decode tokens: the figures are of decoding, and with none each policy
    would read as fast as full at a hit rate of 100%."""
    if not bool(traces.decode.any()):
        raise SeqMoEError("the traces hold no decode tokens (traced with --continuation 0): the simulator replays "
                          "decoding; trace with --continuation 1 or more")


def cache_slots(traces: Traces, cache_ratio: float) -> int:
    """The slots of a cache holding ``cache_ratio`` of all experts; refused below the engine's
    minimum, as the engine refuses it."""
    total, top_k = traces.experts.shape[1] * traces.probs.shape[-1], traces.experts.shape[2]
    slots = ratio_slots(cache_ratio, total)
    if slots < minimum_slots(total, top_k):
        raise BudgetTooSmall(too_few_slots(f"cache ratio {cache_ratio}", slots, total, top_k))
    return slots


def copy_bound(traces: Traces, cache_ratio: float, hardware: Hardware, shape: ModelShape) -> CopyBound:
    """The bound no policy passes on this replay (``bound``), on the virtual clock's costs."""
    slots = cache_slots(traces, cache_ratio)
    accesses = [Access(step.layer, step.experts, step.token is not None) for step in replay_steps(traces, slots)]
    copies, tokens = fewest_copies(accesses, slots)
    copy_layers = hardware.copy_seconds(shape) / hardware.layer_seconds(shape)
    return CopyBound.of(cache_ratio, copies, tokens, traces.experts.shape[1], copy_layers)


def _policy(
    name: str, traces: Traces, steps: list[Step], predictor: ExpertPredictor | None, routers: list[RouterLogits] | None
) -> Policy:
    layers, experts = traces.experts.shape[1], traces.probs.shape[-1]
    if name == "lru":
        return LRUPolicy(layers, experts)
    if name == "gate":
        if routers is None:
            raise ValueError("the gate policy needs the traced model's routers")
        return GatePolicy(routers, experts, traces.experts.shape[2])
    if name in ORACLES:
        lookahead = layers if name == ORACLE_NEXT else None
        return OraclePolicy([(s.layer, frozenset(s.experts)) for s in steps], layers, experts, lookahead=lookahead)
    if name == "seqmoe":
        if predictor is None:  # as the engine runs it until a predictor is calibrated
            if routers is None:
                raise ValueError("the seqmoe policy needs a predictor, or the traced model's routers")
            return RouterSeqMoEPolicy(routers, experts, traces.experts.shape[2])
        prior = predictor.config.prior()
        predict: Callable = predictor.predict
        reuse = predictor.reuse.later_values if predictor.reuse is not None else None
        return SeqMoEPolicy(predict, layers, prior, stride=1, reuse=reuse)  # virtual time: the predictor costs nothing
    raise ValueError(f"the simulator replays {', '.join(SIMULATED_POLICIES)}, not {name!r}")
