"""The SeqMoE predictor: a small sequence-to-sequence forecaster of future experts.

At MoE layer ``l`` of the current token, once the router has chosen, the predictor reads
an input sequence of two items, the layer's input hidden state and the experts just
chosen (both tagged with the layer), and encodes them into one context vector. The
decoder emits the output sequence: for each horizon ``h = 1..H`` a query names the target
layer ``(l + h) mod L`` (past the last layer it is the next token's), is combined with the
context, and yields one logit per expert of that layer.

The decoder is non-autoregressive (all horizons in one batched pass): a forecast runs at
every MoE layer of every token, so it must cost a handful of small matrix products, not
``H`` sequential steps.

A predictor may also carry a reuse head (``reuse.ReuseHead``), which forecasts how many
tokens later each expert comes back, for eviction beyond the forecast's horizon.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from ..counts import is_count
from ..errors import SeqMoEError
from ..non_finite import first_non_finite
from ..router_probe import same_answers
from ..threads import one_cpu_thread
from ..user_files import check_output, replacing, writing
from .reuse import ReuseHead


MAX_WIDTH = 4096
"""The widest predictor made or loaded: one runs within a few percent of a decode layer's compute,
far below this; a width of millions only fails to allocate."""
MAX_HORIZON = 256
"""The farthest forecast made or loaded, in MoE layers: a few tokens of the deepest models."""


@dataclass
class PredictorConfig:
    hidden_size: int
    num_layers: int
    num_experts: int
    top_k: int
    horizon: int = 4
    width: int = 192
    model: dict[str, object] = field(default_factory=dict)
    """The identity of the model the predictor was trained for (see ``trace.model_identity``)."""
    frequency: list[list[float]] = field(default_factory=list)
    """Per-layer share of routed tokens per expert in the training traces: the ``freq`` prior."""
    report: dict[str, object] = field(default_factory=dict)
    reuse_horizons: list[int] = field(default_factory=list)
    """The reuse head's horizons in tokens (see ``reuse``); empty: no head, eviction uses the rate."""
    reuse_width: int = 64

    def __post_init__(self) -> None:
        """Refuse what a damaged or hand-edited config file would hold (``ValueError``), before any
        tensor is made from it."""
        sizes = ("hidden_size", "num_layers", "num_experts", "top_k", "horizon", "width", "reuse_width")
        for name in sizes:
            value = getattr(self, name)
            if not is_count(value, 1):
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        for name, most in (("width", MAX_WIDTH), ("reuse_width", MAX_WIDTH), ("horizon", MAX_HORIZON)):
            if getattr(self, name) > most:
                raise ValueError(f"{name} must be at most {most}, got {getattr(self, name)}")
        if not isinstance(self.model, dict) or not isinstance(self.report, dict):
            raise ValueError("model and report must be JSON objects")
        if self.frequency and not (
            len(self.frequency) == self.num_layers
            and all(isinstance(row, list) and len(row) == self.num_experts for row in self.frequency)
            and all(isinstance(value, (int, float)) for row in self.frequency for value in row)
        ):
            raise ValueError(f"frequency must be {self.num_layers} lists of {self.num_experts} numbers")
        # json reads NaN and Infinity; either would poison the usage history eviction starts from (``prior``).
        if first_non_finite(self.frequency) is not None:
            raise ValueError("frequency must hold finite numbers, got NaN or Infinity")
        if not all(is_count(runs) for runs in self.reuse_horizons):
            raise ValueError(f"reuse_horizons must be whole numbers, got {self.reuse_horizons!r}")

    @classmethod
    def read(cls, file: Path) -> PredictorConfig:
        """The config in ``file``: ``OSError`` where it cannot be read, ``TypeError`` or
        ``ValueError`` where it holds no predictor config of this version."""
        return cls(**json.loads(file.read_text(encoding="utf-8")))

    def prior(self) -> torch.Tensor:
        """``[L, E]`` each expert's chance of use per token in the training traces, where eviction's
        usage history starts."""
        return (torch.tensor(self.frequency) * self.top_k).clamp(max=1.0)


class ExpertPredictor(nn.Module):
    def __init__(self, config: PredictorConfig) -> None:
        super().__init__()
        self.config = config
        width, layers, experts = config.width, config.num_layers, config.num_experts
        self.input_norm = nn.LayerNorm(config.hidden_size)
        self.input_proj = nn.Linear(config.hidden_size, width)
        self.layer_embedding = nn.Embedding(layers, width)
        self.expert_embedding = nn.Embedding(layers * experts, width)
        self.encoder_out = nn.Linear(width, width)
        self.query_embedding = nn.Embedding(layers * config.horizon, width)
        self.decoder_hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, experts)
        self.target_bias = nn.Embedding(layers, experts)
        nn.init.zeros_(self.target_bias.weight)
        self.register_buffer("horizons", torch.arange(1, config.horizon + 1), persistent=False)
        self.reuse = (
            ReuseHead(config.hidden_size, layers, experts, config.reuse_horizons, config.reuse_width)
            if config.reuse_horizons
            else None
        )
        self._tables: _LayerTables | None = None

    def forward(self, hidden: torch.Tensor, layer: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, H, E]`` from hidden states ``[N, hidden]``, layer ids ``[N]`` and routed experts ``[N, k]``."""
        cfg = self.config
        state = self.input_proj(self.input_norm(hidden.to(self.input_proj.weight.dtype)))
        choice = self.expert_embedding(layer.unsqueeze(1) * cfg.num_experts + routed.long()).sum(dim=1)
        context = self.encoder_out(F.gelu(state + choice + self.layer_embedding(layer)))
        target = (layer.unsqueeze(1) + self.horizons) % cfg.num_layers
        # A query per (source layer, horizon): where the forecast starts matters as much as where it lands.
        queries = self.query_embedding(layer.unsqueeze(1) * cfg.horizon + self.horizons - 1)
        decoded = F.gelu(context.unsqueeze(1) + queries)
        decoded = decoded + F.gelu(self.decoder_hidden(decoded))
        return self.head(decoded) + self.target_bias(target)

    def train(self, mode: bool = True) -> "ExpertPredictor":
        self._tables = None
        return super().train(mode)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        """Probabilities ``[H, E]`` that each expert of layers ``l+1 .. l+H`` is used, for one token.

        The same function as ``forward`` for one token, with everything that depends only on
        the layer looked up from tables: it runs at every MoE layer of every decode step.
        """
        with one_cpu_thread(hidden.device):
            return self._predict(hidden, layer, routed)

    def _predict(self, hidden: torch.Tensor, layer: int, routed: torch.Tensor) -> torch.Tensor:
        tables = self._tables
        if tables is None or tables.head.device != hidden.device:
            tables = self._tables = _LayerTables.of(self, hidden.device)
        norm = self.input_norm
        normed = F.layer_norm(hidden.reshape(-1).float(), norm.normalized_shape, norm.weight, norm.bias)
        encoded = torch.addmv(tables.entry[layer], self.input_proj.weight, normed)
        encoded += tables.experts[layer].index_select(0, routed.reshape(-1).long()).sum(dim=0)
        context = torch.mv(self.encoder_out.weight, F.gelu(encoded))
        decoded = F.gelu(tables.queries[layer] + context)
        decoded += F.gelu(F.linear(decoded, self.decoder_hidden.weight, self.decoder_hidden.bias))
        return torch.addmm(tables.out_bias[layer], decoded, tables.head).sigmoid_()


@dataclass(frozen=True)
class _LayerTables:
    """What ``ExpertPredictor.predict`` looks up by source layer, one tensor a layer in Python lists
    (indexing a list is no tensor operation), with every bias that follows a layer folded in: one
    forecast is a dozen small operations, each costing more host time than its arithmetic."""

    entry: list[torch.Tensor]
    """``[W]``: the layer's embedding plus the input projection's bias."""
    experts: list[torch.Tensor]
    """``[E, W]``: the layer's expert embeddings."""
    queries: list[torch.Tensor]
    """``[H, W]``: the layer's H queries plus the encoder output's bias."""
    out_bias: list[torch.Tensor]
    """``[H, E]``: the targets' output biases plus the head's bias."""
    head: torch.Tensor
    """``[W, E]``: the head's weight, transposed for ``addmm``."""

    @classmethod
    @torch.no_grad()
    def of(cls, predictor: ExpertPredictor, device: torch.device) -> _LayerTables:
        cfg, p = predictor.config, predictor
        layers = torch.arange(cfg.num_layers, device=device)
        targets = (layers.unsqueeze(1) + p.horizons.to(device)) % cfg.num_layers
        entry = p.layer_embedding.weight + p.input_proj.bias
        experts = p.expert_embedding.weight.view(cfg.num_layers, cfg.num_experts, -1)
        queries = p.query_embedding.weight.view(cfg.num_layers, cfg.horizon, -1) + p.encoder_out.bias
        out_bias = p.target_bias(targets) + p.head.bias
        return cls(list(entry), list(experts), list(queries), list(out_bias), p.head.weight.t().contiguous())


def check_predictor_output(path: Path, flag: str) -> None:
    """Refuse ``path`` (given with ``flag``) for a predictor to be trained, before the training:
    ``save_predictor`` writes it and its ``.json`` beside it, and either may only replace a
    predictor (its ``.json`` is a predictor config), never a file of the user's (a model's
    config.json, notes, another program's settings)."""
    check_output(path, flag)  # first: a folder (".") has no name to give a suffix
    config_file = path.with_suffix(".json")
    if config_file == path:
        raise SeqMoEError(f"{flag} {path} is where the predictor's config goes, beside its weights; "
                          f"give the weights file, such as {path.with_suffix('.safetensors')}")
    if path.suffix.lower() != ".safetensors":
        raise SeqMoEError(f"{flag} {path}: a predictor is a .safetensors file (its .json config goes beside it); "
                          f"give a name such as {path.with_suffix('.safetensors')}")
    if _is_predictor_config(config_file):
        return  # retraining over one's own predictor
    for file in (path, config_file):
        if file.exists() or file.is_symlink():
            raise SeqMoEError(f"{flag} {path}: {file} exists and is not a predictor; give another name, "
                              "or move the file away")


def _is_predictor_config(file: Path) -> bool:
    try:
        PredictorConfig.read(file)
    except (OSError, TypeError, ValueError):  # none there, a folder, not JSON, not a predictor's
        return False
    return True


def save_predictor(predictor: ExpertPredictor, path: Path) -> None:
    """``path`` (safetensors weights) and ``path`` with suffix ``.json`` (its config). Both are
    written beside their place first and then moved there, so a write cut short (a full disk, a
    cancelled calibration) leaves the earlier predictor, or none, never half of one."""
    config = asdict(predictor.config)
    # A loss over no samples is NaN (``reuse._mean_loss``): null, since bare NaN is no JSON.
    config["report"] = {key: _finite_or_none(value) for key, value in config["report"].items()}
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as weights, replacing(path.with_suffix(".json")) as config_file:
            save_file({k: v.contiguous() for k, v in predictor.state_dict().items()}, str(weights))
            config_file.write_text(json.dumps(config, indent=1))


def _finite_or_none(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def load_predictor(path: Path, identity: dict[str, object] | None = None, device: str | torch.device = "cpu") -> ExpertPredictor:
    """Load a predictor; refuse it if ``identity`` is given and it was trained for another model."""
    if path.is_dir():  # before naming its .json: "/" has no name to give a suffix
        raise SeqMoEError(f"{path} is a folder; a predictor is a .safetensors file with its .json config beside it")
    config_file = path.with_suffix(".json")
    if config_file == path:
        raise SeqMoEError(f"{path} is where a predictor's config goes; give its weights, {path.with_suffix('.safetensors')}")
    if not path.is_file():
        raise SeqMoEError(f"no predictor at {path} (no such file)")
    if not config_file.is_file():
        raise SeqMoEError(f"no predictor at {path} (it needs {path.name} and {config_file.name})")
    try:
        config = PredictorConfig.read(config_file)
    except (TypeError, ValueError) as error:
        raise SeqMoEError(f"{config_file.name} is not a predictor config of this seqmoe version: {error}") from None
    if identity is not None and not same_model(config.model, identity, routers=False):
        raise SeqMoEError(
            f"predictor {path.name} was trained for {config.model.get('name')} "
            f"({config.model.get('architecture')}), not for {identity.get('name')} ({identity.get('architecture')}); "
            "calibrate one for this model with `seqmoe calibrate`"
        )
    if identity is not None and not same_model(config.model, identity):
        raise SeqMoEError(f"predictor {path.name} was trained for other weights of {identity.get('name')} (its routers "
                          "differ: the model was changed since); calibrate one for it with `seqmoe calibrate`")
    try:
        predictor = ExpertPredictor(config)
    except ValueError as error:  # reuse horizons that are no horizons (``ReuseHead``)
        raise SeqMoEError(f"{config_file.name} is not a predictor config of this seqmoe version: {error}") from None
    try:
        weights = load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise SeqMoEError(f"predictor {path} cannot be read: {error}") from None
    try:
        predictor.load_state_dict(weights)
    except RuntimeError:  # its message lists every tensor that differs, over many lines
        raise SeqMoEError(f"predictor {path} does not hold the weights {config_file.name} describes; "
                          "train or calibrate it again") from None
    return predictor.to(device).eval()


def same_model(a: dict[str, object], b: dict[str, object], routers: bool = True) -> bool:
    """Whether identities ``a`` and ``b`` (``trace.model_identity``) are of one model; with
    ``routers=False``, of one configuration, whatever the weights."""
    keys = ("architecture", "config_sha256", "moe_layers", "num_experts", "top_k", "hidden_size")
    if not all(a.get(key) == b.get(key) for key in keys):
        return False
    # Traces and predictors made before the routers were fingerprinted have no digest: their
    # configuration alone speaks for them.
    known = a.get("routers_sha256"), b.get("routers_sha256")
    if not routers or None in known or known[0] == known[1]:
        return True
    # The digest is of the weights as loaded: loaded in float16, the same routers round otherwise.
    return same_answers(a.get("routers_answers"), b.get("routers_answers"))


def parameter_limit(non_expert_parameters: int) -> int:
    """At most 5 M parameters or 2% of the model's non-expert parameters, whichever is larger."""
    return max(5_000_000, non_expert_parameters // 50)
