"""Cache policies: which experts to load ahead of time and which to evict.

A policy sees every access (``observe``), may forecast the experts of the next layers
after a decode layer has been routed (``forecast``) or, in prefill, what the reply's first
token will use (``look_past_prompt``), hears how long decode layers take and wait for copies
(``observe_timing``), ranks the evictable experts (``eviction_order``), and names the experts
an empty cache starts with (``warm_order``). The experts function never sees a policy; it only
asks the cache for slots.

Policies:

- ``full``: every expert resident (the reference speed).
- ``lru``: reactive; load on a miss, evict the least recently used.
- ``gate``: ``lru`` plus speculative prefetch of the next layer's top-k, found by applying
  that layer's router to the current hidden state, every guess loaded (mixtral-offloading's
  method, without SeqMoE's admission rule and schedule).
- ``seqmoe``: the trained predictor's forecast of the next ``H`` layers, scheduled with
  JSD, and modified-Belady eviction on the predicted distances; until a predictor is
  calibrated, ``gate``'s loads with modified-Belady eviction (``RouterSeqMoEPolicy``).
- ``oracle``: the true future of the same greedy run, the same scheduler and Belady:
  the limit for a given cache size and link.
- ``oracle-next``: the oracle that sees only the next token, least recently used beyond it:
  a perfect one-token forecast without any knowledge of later tokens.

**Modified Belady.** A resident expert ``(j, e)`` is ranked by its distance to its next
use, in MoE layers from the layer now running ``l``, with the uncertain part discounted:

    D(j, e) = d - T * L * ln V,     d = (j - l) mod L  (L when j == l),
    V = p + (1 - p) * r g / (1 - (1 - r) g),     g = exp(-1 / T),

where ``p`` is the probability that the next run of layer ``j`` uses ``e`` (the forecast's,
when layer ``j`` is within its horizon) and ``r`` is the expert's recent rate of use per
token (``usage.UsageHistory``: an exponential average over about 32 tokens, starting from
the prior ``k * f(j, e)`` of the expert frequencies ``f``). With probability ``p`` the next use
is the layer's next run; otherwise it comes a geometric number of tokens later. ``V`` is that
next use discounted by ``g`` a token (``T = DISCOUNT_TOKENS``), and ``D`` the distance of a
certain use worth as much: a certain use is ranked by its distance alone. Beyond the forecast
``p = r``. Why not the expected distance, ``d + L (1 - p) / r``: its mean is set by the
far tail, so an expert likely to be used next token but otherwise rarely (``p`` = 0.3, ``r``
small) ranked as farther than one unlikely either way, and was evicted first; the cache
turns over within a few tokens, so the chance of a use soon is what keeping an expert buys
(simulated on the held-out chat at cache ratio 0.45: 4.89 copies per decode token against
5.05). The forecast sees one token ahead; the rate keeps the experts a conversation keeps
coming back to. When the predictor has a reuse head (``predictor.reuse``), its forecast of
when each expert comes back gives the discounted later use, ``E[g ** N]`` over its forecast,
in place of the geometric ``r g / (1 - (1 - r) g)``, for the tokens its forecast speaks for
(the next one, or a few when it runs every few tokens), for the experts not used since it was
made. The expert with the largest ``D`` is evicted; candidates within ``NEAR`` layers of that
largest distance count as equally far, and among them the lowest ``p`` goes first, then the
least recently used.

**Prefill to reply.** During prefill, ``seqmoe`` forecasts from the prompt's last token at
every MoE layer ``l`` and takes the horizons that reach past the prompt: the reply's first
token's layers up to ``l``. Those are the ``p`` of the layers prefill has already passed, so
eviction keeps the experts the reply starts with instead of those the prompt used most.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from .reliability import Reliability
from .routers import RouterLogits
from .transfer import ExpertKey
from .usage import UsageHistory

ORACLE_NEXT = "oracle-next"
"""The oracle that sees one token ahead and nothing beyond (see ``OraclePolicy``)."""
ORACLES = ("oracle", ORACLE_NEXT)
"""Policies that need the recorded future of the same run."""
POLICY_NAMES = ("full", "lru", "gate", "seqmoe", *ORACLES)
ORACLE_TOKENS = 4
"""How many tokens ahead the oracle's forecast reaches. A forecast of one copy time ahead
leaves the link idle whenever a layer needs more copies than the next few layers' compute
hides. Simulated on the held-out chat (RTX 4090, OLMoE shape, cache ratio 0.45, the demo's
8 layers): 56.4% of ``full`` with 4 layers ahead, 59.8% with 1 token, 63.4% with 2, 67.3%
with 4 and 67.1% with 16; with decode at 39% of the memory bandwidth, 94.3%, 98.0% and
99.5% for 4 layers, 1 and 2 tokens, and 99.5% with 4. The cost of planning grows with the
reach and is paid in the bench."""
PREDICTOR_BUDGET = 0.05
"""The largest share of a decode layer's compute the predictor may take, beyond the time the
layer waits for the link anyway (see ``SeqMoEPolicy``)."""
SMALLEST_BUDGET = 1e-9
"""A layer that neither waits nor copies leaves the look-ahead nothing to win: its budget is this
(seconds), and a call or plan then waits until copies are asked for again."""
DISCOUNT_TOKENS = 2.0
"""Eviction's memory: a use one token later is worth ``exp(-1 / DISCOUNT_TOKENS)`` of a use now
(see the module docstring). Simulated on the held-out chat at cache ratios 0.3, 0.45 and 0.6, 2
tokens did better than 1, 4, 8 and 16; on Shakespeare (a text the demo model was not made for)
at 0.45, better than 4, 8 and 16 and as well as 1."""
LATER_DISCOUNT = math.exp(-1.0 / DISCOUNT_TOKENS)
NEAR = 0.5
MIN_PROBABILITY = 1e-3


class Forecast(NamedTuple):
    """Expert ``key`` will be used ``horizon`` layers from now with ``probability``."""

    key: ExpertKey
    probability: float
    horizon: int


class Forecasts(Sequence[Forecast]):
    """Many forecasts as parallel arrays. A forecast names a few hundred experts at every layer
    of a large model, and the cache needs only the few of them that are not resident: they are
    filtered as arrays, not one object at a time."""

    def __init__(self, layer: np.ndarray, expert: np.ndarray, probability: np.ndarray, horizon: np.ndarray) -> None:
        self.layer, self.expert, self.probability, self.horizon = layer, expert, probability, horizon

    @classmethod
    def of(cls, forecasts: Sequence[Forecast]) -> Forecasts:
        if isinstance(forecasts, Forecasts):
            return forecasts
        return cls(
            np.array([f.key[0] for f in forecasts], dtype=np.int64),
            np.array([f.key[1] for f in forecasts], dtype=np.int64),
            np.array([f.probability for f in forecasts], dtype=np.float64),
            np.array([f.horizon for f in forecasts], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.layer)

    def __getitem__(self, index: int) -> Forecast:  # type: ignore[override]
        return Forecast((int(self.layer[index]), int(self.expert[index])), float(self.probability[index]), int(self.horizon[index]))

    def flat(self, num_experts: int) -> np.ndarray:
        """Each forecast expert's ``layer * num_experts + expert`` (see ``flat_indices``)."""
        return self.layer * num_experts + self.expert

    def where(self, mask: np.ndarray) -> Forecasts:
        return Forecasts(self.layer[mask], self.expert[mask], self.probability[mask], self.horizon[mask])

    def later(self, layers: int) -> Forecasts:
        """The same forecasts seen ``layers`` MoE layers later (those not yet passed)."""
        if layers == 0:
            return self
        kept = self.where(self.horizon > layers)
        return Forecasts(kept.layer, kept.expert, kept.probability, kept.horizon - layers)


class Policy:
    """Base policy: reactive loading (no forecast) and least-recently-used eviction.

    Eviction ranks every resident expert at every layer, and a large model's cache holds
    thousands: the ranks are computed over ``[L, E]`` NumPy tables, and only the few victims
    a layer takes are looked at one by one. Experts are passed to it as flat indices,
    ``layer * num_experts + expert`` (``flat_indices``).
    """

    name = "base"
    streams_prefill = False
    """Whether to load layer l+1's experts while layer l computes during prefill."""
    speculative = False
    """Whether every forecast is loaded as it comes (the peers' speculative loading), instead
    of passing the cache's admission rule and deadline schedule."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.last_use = np.zeros((num_layers, num_experts), dtype=np.int64)
        """The clock of each expert's last use (0: never used)."""
        self._clock = 0
        self.layer = 0

    def observe(self, layer: int, experts: Sequence[int]) -> None:
        """Record that MoE layer ``layer`` uses ``experts`` now."""
        self._clock += 1
        self.layer = layer
        # Item by item: a decode layer's few experts cost a fraction of one fancy-indexed assignment.
        for expert in experts:
            self.last_use[layer, expert] = self._clock

    def forecast(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Sequence[Forecast]:
        """Experts of the next layers worth loading, after layer ``layer`` routed one decode token."""
        return ()

    def look_past_prompt(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> None:
        """During prefill, after MoE layer ``layer`` routed the prompt's last token (``hidden``,
        ``routed``): a policy may note which experts of the layers up to ``layer`` the reply's
        first token will use, so that eviction keeps them while prefill streams the rest."""

    def observe_timing(
        self, layer_seconds: float, stall_seconds: float, plan_seconds: float = 0.0, link_load: float = math.inf
    ) -> None:
        """The cache's smoothed measures of a decode layer: its wall time, the part of it spent
        waiting for copies, the host time of one plan of copies (``ExpertCache.plan``), and the
        link's load (copy time asked for per second of compute, ``ExpertCache.link_load``)."""

    def distance(self, key: ExpertKey) -> float | None:
        """MoE layers until ``key`` is used again, as the policy ranks it (the farthest is evicted);
        ``None`` if the policy cannot say."""
        return None

    def stream_order(self, layer: int) -> Sequence[int]:
        """The order in which prefill streams a layer's experts: most used first when known."""
        return range(self.num_experts)

    def warm_order(self, slots: int) -> list[ExpertKey]:
        """At most ``slots`` experts worth copying into the cache's free slots while no prompt runs
        (``ExpertCache.warm``), the likeliest first. None here: a reactive policy knows nothing of
        what comes, and ``lru`` and ``gate`` start empty, as the peers' caches do."""
        return []

    def eviction_order(self, candidates: np.ndarray) -> Iterator[ExpertKey]:
        """``candidates`` (flat indices), the first to evict first: here the least recently used,
        ties to the lowest (layer, expert)."""
        return self._keys(candidates[np.lexsort((candidates, self.last_use.ravel()[candidates]))])

    def recency(self, key: ExpertKey) -> int:
        return int(self.last_use[key])

    def _keys(self, ranked: np.ndarray) -> Iterator[ExpertKey]:
        return (divmod(index, self.num_experts) for index in ranked.tolist())


NO_FORECASTS = Forecasts.of([])


def flat_indices(keys: Sequence[ExpertKey], num_experts: int) -> np.ndarray:
    """``layer * num_experts + expert`` of each key, as the policies' tables are laid out."""
    return np.array([layer * num_experts + expert for layer, expert in keys], dtype=np.int64)


class LRUPolicy(Policy):
    name = "lru"


class FullPolicy(Policy):
    name = "full"

    def eviction_order(self, candidates: np.ndarray) -> Iterator[ExpertKey]:
        raise RuntimeError("the full policy keeps every expert resident and never evicts")


class GatePolicy(Policy):
    """LRU eviction plus the next layer's top-k from its own router on this layer's hidden state."""

    name = "gate"
    streams_prefill = True
    speculative = True

    def __init__(self, routers: list[RouterLogits], num_experts: int, top_k: int) -> None:
        super().__init__(len(routers), num_experts)
        self.routers = routers
        self.top_k = top_k

    def forecast(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Sequence[Forecast]:
        target = (layer + 1) % len(self.routers)
        values, experts = next_layer_distribution(self.routers, layer, hidden).topk(self.top_k)
        ones = np.ones(self.top_k, dtype=np.int64)
        return Forecasts(ones * target, experts.cpu().numpy().astype(np.int64), values.double().cpu().numpy(), ones)


def next_layer_distribution(
    routers: Sequence[RouterLogits], layer: int, hidden: torch.Tensor
) -> torch.Tensor:
    """The next MoE layer's router applied to this layer's hidden state, as probabilities over its experts."""
    return torch.softmax(routers[(layer + 1) % len(routers)](hidden).float().reshape(-1), dim=0)


class BeladyPolicy(Policy):
    """Eviction by the distance to the next use, its uncertain part discounted (see the module docstring)."""

    streams_prefill = True

    def __init__(self, num_layers: int, prior: torch.Tensor) -> None:
        super().__init__(num_layers, prior.shape[1])
        self.prior = prior.clamp(MIN_PROBABILITY, 1.0)
        self.usage = UsageHistory(self.prior)
        self._forecast = np.zeros((num_layers, self.num_experts))
        """The forecast probability of each expert of the layers in ``_forecast_rows``."""
        self._forecast_rows = np.zeros(num_layers, dtype=bool)
        self.reuse_values: np.ndarray | None = None
        """The reuse forecast's ``[L, E]`` worth of each expert's later uses (see ``later_values``)."""
        self._reuse_at = 0
        self._reuse_for = 1
        """Tokens the last reuse forecast speaks for."""
        self._tables: tuple[np.ndarray, np.ndarray] | None = None
        """``(p, D)`` of every expert, ``[L, E]`` each, until the next use, forecast or reuse
        forecast (``observe``, ``remember``, ``_forecast_reuse``) changes them."""

    def observe(self, layer: int, experts: Sequence[int]) -> None:
        super().observe(layer, experts)
        self.usage.record(layer, experts)
        self._tables = None

    def probability(self, key: ExpertKey) -> float:
        """That the next run of the expert's layer uses it."""
        return float(self._ranking()[0][key])

    def distance(self, key: ExpertKey) -> float:
        return float(self._ranking()[1][key])

    def stream_order(self, layer: int) -> Sequence[int]:
        return self.prior[layer].argsort(descending=True).tolist()

    def warm_order(self, slots: int) -> list[ExpertKey]:
        """By the recent rates of use (at first the prior, the predictor's routing frequencies);
        none while they are all equal, as they say nothing then."""
        rates = self.recent_rates().ravel()
        if np.ptp(rates) == 0:
            return []
        return list(self._keys(np.argsort(-rates, kind="stable")[:slots]))

    def recent_rates(self) -> np.ndarray:
        """``[L, E]``: each expert's recent rate of use per run of its layer."""
        return np.maximum(self.usage.rate, MIN_PROBABILITY)

    def later_values(self) -> np.ndarray:
        """``[L, E]``: what each expert's uses after the next run of its layer are worth now, if that
        run does not use it: ``E[g ** N]``, ``N`` the further tokens until its next use."""
        rate = self.recent_rates()
        later = rate * LATER_DISCOUNT / (1.0 - (1.0 - rate) * LATER_DISCOUNT)  # a geometric wait of mean 1 / rate
        # The reuse forecast is made after a token's last layer and speaks for the next tokens
        # until the next one; once more layers than that have run (a prefill began), the rate
        # speaks again. An expert used since the forecast was made has news the forecast lacks:
        # its rate, updated by that use, speaks for it (simulated on the held-out chat, this
        # cut the copies at every cache ratio tried: 5.17 to 5.11 per token at 0.45).
        if self.reuse_values is not None and self._clock - self._reuse_at <= self.num_layers * self._reuse_for:
            later = np.where(self.last_use <= self._reuse_at, self.reuse_values, later)
        return later

    def _ranking(self) -> tuple[np.ndarray, np.ndarray]:
        """``(p, D)`` of every expert (see the module docstring)."""
        if self._tables is None:
            layers = self.num_layers
            p = np.where(self._forecast_rows[:, None], np.maximum(self._forecast, MIN_PROBABILITY), self.recent_rates())
            value = np.maximum(p + (1.0 - p) * self.later_values(), MIN_PROBABILITY)
            steps = (np.arange(layers) - self.layer) % layers
            steps[steps == 0] = layers
            self._tables = p, steps[:, None] + layers * DISCOUNT_TOKENS * -np.log(value)
        return self._tables

    def eviction_order(self, candidates: np.ndarray) -> Iterator[ExpertKey]:
        """The farthest first; the candidates within ``NEAR`` of the farthest left count as equally
        far, and among them the least probable goes first, then the least recently used."""
        probability, distance = self._ranking()
        distance = distance.ravel()[candidates]  # a copy: a victim's entry becomes -inf
        # Each candidate's place in the order the near ones are taken in: least probable, then
        # least recently used, then the lowest (layer, expert).
        order = np.lexsort((candidates, self.last_use.ravel()[candidates], probability.ravel()[candidates]))
        taken_first = np.empty(len(candidates), dtype=np.int64)
        taken_first[order] = np.arange(len(candidates))
        for _ in range(len(candidates)):
            # A few victims are taken per re-plan: a pass over the candidates for each is cheaper
            # than sorting them all by distance.
            near = distance >= distance.max() - NEAR
            chosen = int(np.where(near, taken_first, len(candidates)).argmin())
            distance[chosen] = -np.inf
            yield divmod(int(candidates[chosen]), self.num_experts)

    def remember(self, forecasts: Sequence[Forecast], layers: set[int]) -> None:
        # ``p`` is about the next run of the expert's layer: a forecast reaching past one token
        # (a predictor trained with a horizon above the layer count) names a layer twice, and the
        # later run's probability must not stand for the next one's: the nearest horizon's is kept.
        made = Forecasts.of(forecasts)
        if not len(made) and not layers and not self._forecast_rows.any():
            return  # nothing forecast, as before: a layer past the forecast's end costs no table
        if len(made) and made.horizon.max() > self.num_layers:
            nearest_first = np.argsort(made.horizon, kind="stable")
            _, first = np.unique(made.flat(self.num_experts)[nearest_first], return_index=True)
            made = made.where(nearest_first[first])
        self._forecast.fill(0.0)
        self._forecast[made.layer, made.expert] = made.probability
        self._forecast_rows.fill(False)
        self._forecast_rows[list(layers)] = True
        self._tables = None


class SeqMoEPolicy(BeladyPolicy):
    """The trained predictor's forecast, JSD-scheduled prefetches, modified-Belady eviction.

    The look-ahead's budget per decode layer is ``PREDICTOR_BUDGET`` of the layer's compute (or
    less: at most the link time the layer asks for, all that looking ahead can save)
    plus the time the layer still waits for copies (the cache measures both, and the host time
    of its plans, and tells the policy, ``observe_timing``). The look-ahead is the predictor's
    call, the reuse forecast and the cache's plan of the copies. While the link is behind, host
    time spent looking ahead is time the layer would have waited anyway: the queued copies go on
    meanwhile. The wait is measured with the look-ahead running, so one dearer than the wait it
    would find settles at about half of it. When a call and its plan cost more than the budget,
    the predictor runs every ``stride``-th MoE layer only. The layers in between re-plan with
    what is left of the last forecast when the budget has room for those plans too
    (``replans_between``), and otherwise leave the copies planned as they are; a stride past the
    forecast's horizon leaves the layers beyond it to the rates. On a link whose copies cost less
    than planning them, a plan at every layer and a forecast at least once a token made decode
    slower than loading on demand. The stride is chosen from the measured costs and the measured
    times per layer, unless it is fixed (then every layer re-plans). The reuse forecast, once a
    token, may take half the budget: when it costs more, it runs every ``reuse_stride``-th token
    (measured: every other token evicts as well as every token), and the forecast gets what it
    leaves. The forecasts' probabilities pass through ``reliability``, which learns from every
    decode layer's routing how often forecasts like them came true (see ``reliability.py``).
    """

    name = "seqmoe"

    def __init__(
        self,
        predict: Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor],
        num_layers: int,
        prior: torch.Tensor,
        min_probability: float = 0.02,
        stride: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        horizon: int | None = None,
        reuse: Callable[[torch.Tensor, np.ndarray, np.ndarray, float], np.ndarray] | None = None,
    ) -> None:
        super().__init__(num_layers, prior)
        self.predict = predict
        self.reuse = reuse
        """The predictor's reuse head (``ReuseHead.later_values``), run after each token's last layer."""
        self.horizon = horizon
        """Use at most this many of the forecast's layers (``None``: all)."""
        self.min_probability = min_probability
        self.fixed_stride = stride
        self.clock = clock
        self.calls = 0
        self.predict_seconds = 0.0
        self.reuse_seconds = 0.0
        self._call_seconds: float | None = None
        self._reuse_call_seconds: float | None = None
        self._tokens_since_reuse = 0
        self._layer_seconds: float | None = None
        self._stall_seconds = 0.0
        self._plan_seconds = 0.0
        self._link_load = math.inf
        self._made = NO_FORECASTS
        self._made_at = -(10**9)
        self._targets: list[int] = []
        """The target layer of each horizon of the last call."""
        self._raw: np.ndarray | None = None
        """``[H, E]``: the last call's probabilities as the predictor gave them."""
        self._routed: Sequence[int] = ()
        """The experts the layer observed last used (``forecast`` follows its layer's ``observe``)."""
        self.reliability = Reliability()

    def observe(self, layer: int, experts: Sequence[int]) -> None:
        super().observe(layer, experts)
        self._routed = experts

    def observe_timing(
        self, layer_seconds: float, stall_seconds: float, plan_seconds: float = 0.0, link_load: float = math.inf
    ) -> None:
        self._layer_seconds, self._stall_seconds, self._plan_seconds = layer_seconds, stall_seconds, plan_seconds
        self._link_load = link_load

    @property
    def budget(self) -> float | None:
        """Seconds per decode layer the look-ahead (the predictor, the reuse forecast and the plans
        of copies) may take; ``None`` until a decode layer was timed. Beyond the wait for the link,
        never more than the link time the layer asks for: looking ahead saves at most that."""
        if not self._layer_seconds:
            return None
        stall = min(max(self._stall_seconds, 0.0), self._layer_seconds)
        share = min(PREDICTOR_BUDGET, max(self._link_load, 0.0))
        return max(share * (self._layer_seconds - stall) + stall, SMALLEST_BUDGET)

    @property
    def stride(self) -> int:
        """MoE layers from one call of the predictor to the next (each call is planned)."""
        return self._look_ahead_rule()[0]

    @property
    def replans_between(self) -> bool:
        """Whether the layers between two calls re-plan with the rest of the last forecast."""
        return self._look_ahead_rule()[1]

    def _look_ahead_rule(self) -> tuple[int, bool]:
        """``(stride, replans_between)``: the fewest layers between calls that the budget pays
        for with a plan at each call, and re-plans between them if the budget has room for
        them as well."""
        budget = self.budget
        if self.fixed_stride is not None or self._call_seconds is None or budget is None:
            return self.fixed_stride or 1, True
        reuse = (self._reuse_call_seconds or 0.0) / (self.reuse_stride * self.num_layers)
        call, plan, left = self._call_seconds, self._plan_seconds, max(budget - reuse, budget / 2)
        stride = max(1, math.ceil((call + plan) / left))
        spare = max(left - (call + plan) / stride, 0.0)
        return stride, plan * (stride - 1) / stride <= spare

    @property
    def reuse_stride(self) -> int:
        budget = self.budget
        if self.fixed_stride is not None or self._reuse_call_seconds is None or budget is None:
            return 1
        return max(1, math.ceil(self._reuse_call_seconds / (budget * self.num_layers / 2)))

    def forecast(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Sequence[Forecast]:
        """The forecast to plan now: a new one every ``stride`` layers, the rest of the last one
        in between, or nothing in between when the budget has no room for those plans (eviction
        still ranks by the rest of the last one)."""
        elapsed = self._clock - self._made_at
        self._score(layer, elapsed)
        stride, replans_between = self._look_ahead_rule()
        if elapsed >= stride:
            self._made = self._call(layer, hidden, routed)
            self._made_at, elapsed = self._clock, 0
        forecasts = self._made.later(elapsed) if elapsed < len(self._targets) else NO_FORECASTS
        self.remember(forecasts, set(self._targets[elapsed:]))
        if self.reuse is not None and layer == self.num_layers - 1:
            self._tokens_since_reuse += 1
            if self._tokens_since_reuse >= self.reuse_stride:
                self._forecast_reuse(hidden)
        return forecasts if elapsed == 0 or replans_between else NO_FORECASTS

    def look_past_prompt(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> None:
        # Prefill streams every layer's routed experts in turn and keeps evicting the layers it
        # has passed; the reply's first token needs a few of exactly those, and the forecast from
        # the prompt's last token reaches them (the horizons past the prompt's last layer). Only
        # eviction hears it: the link is busy streaming, and the reply's first layers re-plan.
        # Not counted in the decode cost of the predictor: it runs once per prefill layer.
        probs = self._predict(layer, hidden, routed)
        reply = range(self.num_layers - layer, 2 * self.num_layers - layer)
        reached = {(layer + h) % self.num_layers for h in range(1, probs.shape[0] + 1) if h in reply}
        made = self._forecasts(layer, probs)
        self.remember(made.where((made.horizon >= reply.start) & (made.horizon < reply.stop)), reached)

    def _score(self, layer: int, elapsed: int) -> None:
        """Tell ``reliability`` how the last call's forecast of this run of ``layer`` turned out
        (the experts its ``observe`` heard)."""
        if self._raw is None or not 0 < elapsed <= len(self._raw) or self._targets[elapsed - 1] != layer:
            return
        self.reliability.score(self._raw[elapsed - 1], self._routed)

    def _forecast_reuse(self, hidden: torch.Tensor) -> None:
        start = self.clock()
        self.reuse_values = self.reuse(hidden.reshape(-1), self.usage.rate, self.usage.age, LATER_DISCOUNT)
        self._reuse_at, self._reuse_for, self._tokens_since_reuse = self._clock, self.reuse_stride, 0
        self._tables = None
        seconds = self.clock() - start
        self.reuse_seconds += seconds
        self._reuse_call_seconds = _smoothed(self._reuse_call_seconds, seconds)

    def _call(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Forecasts:
        start = self.clock()
        probs = self._predict(layer, hidden, routed)
        seconds = self.clock() - start
        self.calls += 1
        self.predict_seconds += seconds
        self._call_seconds = _smoothed(self._call_seconds, seconds)
        self._targets = [(layer + h) % self.num_layers for h in range(1, probs.shape[0] + 1)]
        self._raw = probs
        return self._forecasts(layer, probs)

    def _predict(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> np.ndarray:
        """``[H, E]``: the probability of each expert at each of the next ``H`` MoE layers, as given."""
        probs = self.predict(hidden.reshape(-1), layer, routed.reshape(-1)).float().cpu().numpy()
        return probs[: self.horizon].astype(np.float64)

    def _forecasts(self, layer: int, raw: np.ndarray) -> Forecasts:
        probs = self.reliability(raw)
        horizons, experts = np.nonzero(probs >= self.min_probability)
        return Forecasts((layer + horizons + 1) % self.num_layers, experts, probs[horizons, experts], horizons + 1)


class RouterSeqMoEPolicy(SeqMoEPolicy):
    """``seqmoe`` until a predictor is calibrated for the model: the next layer's router on this
    layer's hidden state forecasts, its top-k are loaded as ``gate`` loads them, and eviction is
    the modified Belady's, on the router's forecast (through ``reliability``) and the rates.

    Why not the schedule and its admission rule: a forecast one layer ahead is due before a
    copy of a few layers' length could finish, so every job is late, and only the likeliest
    pass the rule on a busy link. On the demo model with its predictor withheld (the bench's
    held-out prompts, default link, two rounds each), scheduling them ran at 23.0% and 22.5% of
    ``full`` at cache ratio 0.45, below ``gate``'s 24.3% and 26.5% in the same runs; loading the
    top-k ran at 26.2% and 26.3% (``gate`` 25.7% and 25.9%), with fewer copies (8.2 a token
    against 8.9) and a higher hit rate (57.3% and 57.8% against 54.9% and 54.3%).
    """

    speculative = True

    def __init__(self, routers: Sequence[RouterLogits], num_experts: int, top_k: int) -> None:
        layers = len(routers)

        def predict(hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
            return next_layer_distribution(routers, layer, hidden).unsqueeze(0)

        # Every expert's share is kept (among 128, the top-k's are often below the trained
        # predictor's floor of 0.02), and the router runs at every layer, as gate's does: a stride
        # would leave the layers between its calls with nothing to load, one layer being all it sees.
        prior = torch.full((layers, num_experts), top_k / num_experts)
        super().__init__(predict, layers, prior, min_probability=0.0, stride=1)
        self.top_k = top_k

    def forecast(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Sequence[Forecast]:
        made = Forecasts.of(super().forecast(layer, hidden, routed))
        return made.where(np.argsort(-made.probability, kind="stable")[: self.top_k])


def _smoothed(average: float | None, sample: float, alpha: float = 0.2) -> float:
    return sample if average is None else average + alpha * (sample - average)


class OraclePolicy(BeladyPolicy):
    """Knows the future: the experts of every later acquire of the same greedy run.

    Its forecast covers the next ``horizon`` acquires (``ORACLE_TOKENS`` tokens by default).
    With ``lookahead`` it knows only the next ``lookahead`` acquires (``num_layers`` of them:
    the rest of this token and the next one), and forecasts no further: a perfect forecast of
    that far with no knowledge beyond it, since its eviction ranks the experts needed beyond
    it as unknown, least recently used first. (``seqmoe``'s reuse forecast looks further, so
    it may pass it.)
    """

    name = "oracle"

    def __init__(
        self,
        future: list[tuple[int, frozenset[int]]],
        num_layers: int,
        num_experts: int,
        horizon: int | None = None,
        lookahead: int | None = None,
    ) -> None:
        super().__init__(num_layers, torch.full((num_layers, num_experts), MIN_PROBABILITY))
        self.future = future
        horizon = ORACLE_TOKENS * num_layers if horizon is None else horizon
        self.horizon = horizon if lookahead is None else min(horizon, lookahead)  # it forecasts no further than it sees
        self.lookahead = lookahead
        self.position = -1
        self._next_use = np.full((num_layers, num_experts), _NEVER, dtype=np.int64)
        """The position of each expert's next use after ``position``."""
        uses = [(position, layer, expert) for position, (layer, experts) in enumerate(future) for expert in sorted(experts)]
        self._use_position, self._use_layer, self._use_expert = np.array(uses, dtype=np.int64).reshape(-1, 3).T
        self._uses_from = np.searchsorted(self._use_position, np.arange(len(future) + 1))
        """Where each position's uses start in the arrays of all uses."""
        self._use_after = np.empty(len(uses), dtype=np.int64)
        """The position of the same expert's next use after each use."""
        for index in reversed(range(len(uses))):
            position, layer, expert = uses[index]
            self._use_after[index] = self._next_use[layer, expert]
            self._next_use[layer, expert] = position

    def observe(self, layer: int, experts: Sequence[int]) -> None:
        super().observe(layer, experts)
        self.position += 1
        if self.position < len(self.future):
            uses = slice(self._uses_from[self.position], self._uses_from[self.position + 1])
            self._next_use[self._use_layer[uses], self._use_expert[uses]] = self._use_after[uses]

    def forecast(self, layer: int, hidden: torch.Tensor, routed: torch.Tensor) -> Sequence[Forecast]:
        last = len(self.future)
        uses = slice(self._uses_from[min(self.position + 1, last)], self._uses_from[min(self.position + 1 + self.horizon, last)])
        certain = np.ones(uses.stop - uses.start)
        return Forecasts(self._use_layer[uses], self._use_expert[uses], certain, self._use_position[uses] - self.position)

    def distance(self, key: ExpertKey) -> float:
        return float(self._distances(self._next_use[key]))

    def _distances(self, next_use: np.ndarray) -> np.ndarray:
        steps = (next_use - self.position).astype(np.float64)
        unseen = next_use == _NEVER
        if self.lookahead is not None:
            unseen |= steps > self.lookahead
        return np.where(unseen, np.inf, steps)

    def warm_order(self, slots: int) -> list[ExpertKey]:
        """The experts of the run as it will first use them (from here, within what it sees): those the
        cache would have to copy first."""
        seen = self.future[self.position + 1 :]
        if self.lookahead is not None:
            seen = seen[: self.lookahead]
        order: dict[ExpertKey, None] = {}
        for layer, experts in seen:
            for expert in sorted(experts):
                order.setdefault((layer, expert))
                if len(order) == slots:
                    return list(order)
        return list(order)

    def stream_order(self, layer: int) -> Sequence[int]:
        for used_layer, experts in self.future[self.position + 1 :]:
            if used_layer == layer:
                return sorted(experts)
        return ()

    def eviction_order(self, candidates: np.ndarray) -> Iterator[ExpertKey]:
        """The farthest first, then the least recently used, then the highest (layer, expert)."""
        distance = self._distances(self._next_use.ravel()[candidates])
        return self._keys(candidates[np.lexsort((-candidates, self.last_use.ravel()[candidates], -distance))])


_NEVER = 2**62
"""The oracle's next use of an expert the future does not use again."""
