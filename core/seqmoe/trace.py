"""Routing traces: what every MoE layer saw and chose, token by token.

A trace folder holds ``manifest.json`` and shards ``shard-00000.safetensors``, ... Each
shard has, for its ``T`` tokens and the model's ``L`` MoE layers (see README, "Trace
format"):

- ``hidden``   float16 ``[T, L, hidden_size]``: the MoE input hidden state;
- ``experts``  int16   ``[T, L, top_k]``: the experts the router chose;
- ``probs``    float16 ``[T, L, num_experts]``: softmax of the router's logits;
- ``document`` int32   ``[T]``: which document (or conversation) the token belongs to;
- ``decode``   uint8   ``[T]``: 1 for tokens produced by greedy continuation, 0 for prefill.

Tokens are in model order: token ``t+1`` of a document follows token ``t``.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache

from .budget import context_held
from .counts import is_count
from .errors import SeqMoEError
from .experts import decode_phase
from .hub_files import json_object
from .loader import LoadedModel
from .router_probe import router_answers
from .routers import LinearRouter, Router, chosen_experts, find_routers
from .user_files import check_output, missing_folders, output_folder, remove_empty, replacing, writing

FORMAT = "seqmoe-trace"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
SHARD_TOKENS = 8192
PREFILL_CHUNK = 128
SHARD_KEYS = {"hidden", "experts", "probs", "document", "decode"}
"""The tensors every shard holds (``paragraph`` came later: older traces lack it)."""
SHARD_NAME = re.compile(r"shard-\d{5,}\.safetensors")
LEFTOVER_NAME = re.compile(rf"{SHARD_NAME.pattern}|{re.escape(MANIFEST)}\.partial")
"""What a trace stopped by force (a kill, a power cut) can leave in its folder without a manifest."""


def model_identity(loaded: LoadedModel) -> dict[str, object]:
    """What makes traces and predictors of one model unusable with another."""
    config_bytes = (loaded.path / "config.json").read_bytes()
    layout = loaded.host.layout
    return {
        "architecture": loaded.architecture,
        "name": loaded.path.name,
        "config_sha256": hashlib.sha256(config_bytes).hexdigest(),
        "routers_sha256": routers_digest(loaded),
        "routers_answers": router_answers(loaded),
        "moe_layers": loaded.host.num_layers,
        "num_experts": layout.num_experts,
        "top_k": loaded.top_k,
        "hidden_size": loaded.config.get_text_config().hidden_size,
    }


_ROUTER_DIGESTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def routers_digest(loaded: LoadedModel) -> str:
    """sha256 of every MoE layer's router weights. A predictor forecasts their choices: weights
    saved over a model's folder under the same config.json (a fine-tune, a re-download of another
    revision) make another model to it. Hashed in bfloat16, so that a bfloat16 checkpoint loaded in
    float32 is the same model (float16 rounds otherwise: ``router_probe`` tells those apart); once per
    loaded model (tens of MB for the largest routers)."""
    digest = _ROUTER_DIGESTS.get(loaded.model)
    if digest is None:
        hashed = hashlib.sha256()
        for router in find_routers(loaded):
            for tensor in _router_tensors(router):
                hashed.update(tensor.detach().to("cpu", torch.bfloat16).reshape(-1).view(torch.uint8).numpy())
        digest = _ROUTER_DIGESTS[loaded.model] = hashed.hexdigest()
    return digest


def _router_tensors(router: Router) -> list[torch.Tensor]:
    if isinstance(router, LinearRouter):
        return [router.weight] if router.bias is None else [router.weight, router.bias]
    return list(router.module.state_dict().values())


class RoutingRecorder:
    """Forward hooks that capture each MoE layer's input, choice and router logits."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.layers = loaded.host.num_layers
        self.hidden: list[torch.Tensor | None] = [None] * self.layers
        self.experts: list[torch.Tensor | None] = [None] * self.layers
        self.logits: list[torch.Tensor | None] = [None] * self.layers
        self._handles = []
        for index, (experts, router) in enumerate(zip(loaded.experts, find_routers(loaded))):
            self._handles.append(experts.register_forward_pre_hook(self._experts_hook(index), with_kwargs=True))
            self._handles.append(router.module.register_forward_pre_hook(self._router_hook(index, router), with_kwargs=True))

    def _experts_hook(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            self.hidden[index] = hidden.detach().to("cpu", torch.float16)
            self.experts[index] = chosen_experts(args, kwargs).detach().to("cpu", torch.int16)

        return hook

    def _router_hook(self, index: int, router: Router) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            self.logits[index] = router.logits(hidden.detach()).reshape(-1, router.num_experts).to("cpu")

        return hook

    def take(self) -> dict[str, torch.Tensor]:
        """The records of the last forward pass, stacked to ``[T, L, ...]``."""
        if any(x is None for x in self.hidden + self.experts + self.logits):
            raise SeqMoEError("a forward pass did not reach every MoE layer")
        record = {
            "hidden": torch.stack(self.hidden, dim=1),
            "experts": torch.stack(self.experts, dim=1),
            "probs": torch.softmax(torch.stack(self.logits, dim=1), dim=-1).to(torch.float16),
        }
        self.hidden = [None] * self.layers
        self.experts = [None] * self.layers
        self.logits = [None] * self.layers
        return record

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Document:
    """Token ids to prefill, then how many tokens to continue greedily."""

    ids: list[int]
    continuation: int


@dataclass(frozen=True)
class TextDocument:
    """A document to trace and the paragraph of the text it comes from."""

    ids: list[int]
    paragraph: int
    """With ``every_turn``, one conversation's documents share it (and their beginning)."""


def read_documents(text: str, tokenize: Callable[[list[str]], list[int]], every_turn: bool = False) -> list[TextDocument]:
    """Blank-line separated paragraphs of ``text``, each tokenized by ``tokenize(lines)``. With
    ``every_turn`` (chat text), a paragraph gives one document per user turn: the conversation up
    to it, so that the model replies to each turn, not only to the last. Lines end at a newline
    only: ``splitlines`` would also cut one at U+2028 and Unicode's other separators, and shift
    every later line of a conversation into the other role."""
    paragraphs = [[line.strip() for line in p.split("\n") if line.strip()] for p in text.split("\n\n")]
    return [
        TextDocument(tokenize(lines[:end]), paragraph)
        for paragraph, lines in enumerate(p for p in paragraphs if p)
        for end in (range(1, len(lines) + 1, 2) if every_turn else [len(lines)])
    ]


def chat_tokenizer(loaded: LoadedModel) -> Callable[[list[str]], list[int]]:
    """Lines alternate user and assistant turns; the result ends with the assistant's prompt."""
    loaded.check_chat_template()
    tokenizer = loaded.tokenizer

    def tokenize(lines: list[str]) -> list[int]:
        turns = lines if len(lines) % 2 == 1 else lines[:-1]
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": line} for i, line in enumerate(turns)]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    return tokenize


def plain_tokenizer(loaded: LoadedModel) -> Callable[[list[str]], list[int]]:
    tokenizer = loaded.tokenizer
    return lambda lines: tokenizer(" ".join(lines), add_special_tokens=True)["input_ids"]


def windows(ids: list[int], continuation: int, context: int | None) -> list[Document]:
    """``ids`` continued for ``continuation`` tokens, as documents that each fit ``context`` tokens
    (``None``: any length): a longer text in consecutive windows, each continued. Routing at the
    positions past the model's context, which it never saw in training, would teach a predictor
    what the engine never meets, and a long calibration text is the common case, not a mistake."""
    if context is None or len(ids) + continuation <= context:
        return [Document(ids, continuation)]
    room = context - continuation
    if room < 1:
        raise SeqMoEError(f"a continuation of {continuation} tokens leaves no room for the text in the "
                          f"{context}-token context: continue for fewer tokens")
    return [Document(ids[start : start + room], continuation) for start in range(0, len(ids), room)]


@torch.inference_mode()
def trace_document(
    loaded: LoadedModel, recorder: RoutingRecorder, document: Document, chunk: int = PREFILL_CHUNK
) -> dict[str, torch.Tensor]:
    """Prefill ``document`` in chunks, then continue greedily, recording every token. A document
    that would run past the model's context is refused (``windows`` splits a text to fit)."""
    limit = loaded.context_limit
    if limit is not None and len(document.ids) + document.continuation > limit:
        raise SeqMoEError(f"the document is {len(document.ids)} tokens, continued for {document.continuation}, "
                          f"and the context holds {limit} (the model's limit): shorten it")
    model = loaded.model
    cache = DynamicCache(config=model.config)
    records, decode_flags = [], []
    ids = torch.tensor([document.ids], device=loaded.device)
    logits = None
    for start in range(0, ids.shape[1], chunk):
        piece = ids[:, start : start + chunk]
        logits = model(input_ids=piece, cache=cache, use_cache=True).logits
        records.append(recorder.take())
        decode_flags.append(torch.zeros(piece.shape[1], dtype=torch.uint8))
    eos = set(_eos_ids(loaded))
    with decode_phase(loaded.experts):  # for an engine's offloaded layers, as its generate runs them
        for _ in range(document.continuation):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            if token.item() in eos:
                break
            logits = model(input_ids=token, cache=cache, use_cache=True).logits
            records.append(recorder.take())
            decode_flags.append(torch.ones(1, dtype=torch.uint8))
    merged = {key: torch.cat([r[key] for r in records]) for key in records[0]}
    merged["decode"] = torch.cat(decode_flags)
    return merged


def _eos_ids(loaded: LoadedModel) -> list[int]:
    if loaded.model.generation_config.eos_token_id is None:
        eos = loaded.tokenizer.eos_token_id
        return [] if eos is None else [eos]
    return loaded.end_token_ids


def iter_traces(
    loaded: LoadedModel,
    documents: list[TextDocument],
    continuation: int,
    max_tokens: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    context: int | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Trace each document in turn until ``max_tokens`` tokens are recorded. One that does not fit
    ``context`` tokens (at most, and by default, the model's own limit) with its continuation is
    traced in ``windows``: each a document of its own, begun afresh (the later ones mid-text, without
    the tokenizer's opening tokens), of the same paragraph (so that training validates on none of a text it learnt from)."""
    context = loaded.context_limit if context is None else context_held(context, loaded.context_limit)
    recorder = RoutingRecorder(loaded)
    recorded = number = 0
    try:
        for document in documents:
            for window in windows(document.ids, continuation, context):
                if max_tokens is not None and recorded >= max_tokens:
                    return
                record = trace_document(loaded, recorder, window)
                tokens = record["decode"].shape[0]
                record["document"] = torch.full((tokens,), number, dtype=torch.int32)
                record["paragraph"] = torch.full((tokens,), document.paragraph, dtype=torch.int32)
                number += 1
                recorded += tokens
                if on_progress is not None:
                    on_progress(tokens)
                yield record
    finally:
        recorder.close()


@dataclass
class Traces:
    """A trace folder, loaded: the manifest and the tensors of all shards concatenated."""

    manifest: dict[str, object]
    hidden: torch.Tensor
    experts: torch.Tensor
    probs: torch.Tensor
    document: torch.Tensor
    decode: torch.Tensor
    paragraph: torch.Tensor | None = None
    """The paragraph of the text each token's document comes from (``TextDocument``); ``None`` in
    traces recorded before it was kept, where each document is its own."""

    @property
    def tokens(self) -> int:
        return self.document.shape[0]


@dataclass(frozen=True)
class Run:
    """One run of every MoE layer, as the engine makes it: a prefill chunk or one decode token."""

    tokens: torch.Tensor
    """Indices into the trace."""
    decode: bool


def document_runs(traces: Traces) -> list[tuple[int, list[Run]]]:
    """Each document of ``traces`` and its runs in execution order: its prefill in chunks of
    ``PREFILL_CHUNK`` tokens (as ``trace_document`` ran them), then its decode tokens."""
    documents = []
    for document in traces.document.unique().tolist():
        in_document = traces.document == document
        prefill = (in_document & (traces.decode == 0)).nonzero().squeeze(1)
        decode = (in_document & (traces.decode == 1)).nonzero().squeeze(1)
        # (``split`` of an empty tensor gives one empty piece, not none.)
        runs = [Run(chunk, False) for chunk in prefill.split(PREFILL_CHUNK) if chunk.numel()]
        documents.append((document, runs + [Run(token, True) for token in decode.split(1) if token.numel()]))
    return documents


def check_trace_folder(out: Path) -> None:
    """Refuse ``out`` for a trace before any work (see ``write_traces``); the folders made to try
    writing there are removed again."""
    if out.is_dir():
        _earlier_trace(out)
    missing = missing_folders(out)
    try:
        check_output(out, "the trace folder", folder=True)
    finally:
        remove_empty(missing)


def write_traces(out: Path, identity: dict[str, object], records: Iterator[dict[str, torch.Tensor]]) -> dict[str, object]:
    """Write ``records`` as shards of about ``SHARD_TOKENS`` tokens and the manifest last. An
    earlier trace's manifest goes as the first shard is written: a run stopped midway leaves no
    folder that reads as a trace, where its shards would mix with the earlier ones, and removes
    the shards it wrote, those of the earlier trace, and the folder if it made it. A finished run
    removes the earlier trace's shards it did not write over. Refused before any tracing: a
    ``manifest.json`` that is not a trace's, or a folder of other files without a trace (the
    user's own, never removed)."""
    manifest_file = out / MANIFEST
    with output_folder(out, "the trace folder"):
        earlier = _earlier_trace(out)
        written: list[Path] = []
        try:
            manifest = _write_shards(out, identity, records, written)
            with writing(manifest_file), replacing(manifest_file) as partial:
                partial.write_text(json.dumps(manifest, indent=2))
        except BaseException:
            if not manifest_file.exists():  # else the earlier trace is untouched, or this one complete
                _remove(written + earlier)
            raise
        kept = {shard["file"] for shard in manifest["shards"]}
        _remove([shard for shard in earlier if shard.name not in kept])
    return manifest


def _earlier_trace(out: Path) -> list[Path]:
    """The shard files the trace in the folder ``out`` lists, or those a trace stopped by force left
    there; refused when ``out`` holds the user's own files instead of a trace (a hidden file, such as
    a file manager's, is nobody's work)."""
    manifest_file = out / MANIFEST
    if manifest_file.exists():
        manifest = _trace_manifest(manifest_file)
        if manifest is None:
            raise SeqMoEError(f"the trace folder {out} holds a manifest.json that is not a seqmoe trace; give another folder")
        listed = manifest.get("shards")
        names = [shard.get("file") for shard in listed if isinstance(shard, dict)] if isinstance(listed, list) else []
        # Only names a trace gives its shards: a damaged manifest must not name the user's files to remove.
        return [out / name for name in names if isinstance(name, str) and SHARD_NAME.fullmatch(name)]
    entries = [entry for entry in out.iterdir() if not entry.name.startswith(".")]
    own = sorted(entry.name for entry in entries if not (LEFTOVER_NAME.fullmatch(entry.name) and entry.is_file()))
    if own:
        raise SeqMoEError(f"the trace folder {out} holds files and no trace ({', '.join(own[:3])}"
                          f"{', ...' if len(own) > 3 else ''}); give a new or empty folder")
    return entries  # what a trace stopped by force left: removed as this one is written


def _trace_manifest(file: Path) -> dict[str, object] | None:
    manifest = json_object(file)
    return manifest if manifest.get("format") == FORMAT else None


def _remove(files: list[Path]) -> None:
    for file in files:
        file.unlink(missing_ok=True)


def _write_shards(
    out: Path, identity: dict[str, object], records: Iterator[dict[str, torch.Tensor]], written: list[Path]
) -> dict[str, object]:
    """The shards of ``records`` (each file added to ``written`` before it is), and the manifest to list them."""
    shards, pending, pending_tokens = [], [], 0
    totals = {"tokens": 0, "decode_tokens": 0, "documents": 0}

    def flush() -> None:
        nonlocal pending, pending_tokens
        if not pending:
            return
        tensors = {key: torch.cat([r[key] for r in pending]).contiguous() for key in pending[0]}
        shard = out / f"shard-{len(shards):05d}.safetensors"
        if not shards:  # the earlier trace goes as the first shard of this one is written, not sooner
            with writing(out / MANIFEST):
                (out / MANIFEST).unlink(missing_ok=True)
        written.append(shard)
        with writing(shard):
            save_file(tensors, str(shard))
        shards.append({"file": shard.name, "tokens": tensors["document"].shape[0]})
        pending, pending_tokens = [], 0

    for record in records:
        pending.append(record)
        pending_tokens += record["document"].shape[0]
        totals["tokens"] += record["document"].shape[0]
        totals["decode_tokens"] += int(record["decode"].sum())
        totals["documents"] += 1
        if pending_tokens >= SHARD_TOKENS:
            flush()
    flush()
    if not shards:
        raise SeqMoEError("the text produced no tokens to trace")
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": identity,
        "layers": identity["moe_layers"],
        "experts": identity["num_experts"],
        "top_k": identity["top_k"],
        **totals,
        "prefill_tokens": totals["tokens"] - totals["decode_tokens"],
        "shards": shards,
    }


def read_traces(folder: Path) -> Traces:
    manifest_file = folder / MANIFEST
    if not manifest_file.is_file():
        raise SeqMoEError(f"{folder} holds no traces (no manifest.json)")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as error:
        raise SeqMoEError(f"{manifest_file} cannot be read: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise SeqMoEError(f"{folder} holds traces of an unknown format or version")
    listed, model = manifest.get("shards"), manifest.get("model")
    if not isinstance(model, dict) or not isinstance(listed, list) or not listed or not all(
        isinstance(shard, dict) and isinstance(shard.get("file"), str) and isinstance(shard.get("tokens"), int)
        for shard in listed
    ) or not all(isinstance(model.get(key), str) for key in ("name", "config_sha256")) or not all(
        is_count(model.get(key), 1) for key in ("moe_layers", "num_experts", "top_k", "hidden_size")
    ):
        raise SeqMoEError(f"{manifest_file} is damaged: it lacks the traced model or the list of shards; trace again")
    files = [shard["file"] for shard in listed]
    outside = next((file for file in files if Path(file).name != file or file in ("", "..")), None)
    if outside is not None:
        raise SeqMoEError(f"{manifest_file} lists the shard {outside!r}, not a file in {folder}: a trace's shards lie "
                          "in its folder; trace again")
    twice = next((file for number, file in enumerate(files) if file in files[:number]), None)
    if twice is not None:
        raise SeqMoEError(f"{manifest_file} lists the shard {twice} twice; trace again")
    shards = []
    for shard in listed:
        try:
            tensors = load_file(str(folder / shard["file"]))
        except (OSError, SafetensorError) as error:
            raise SeqMoEError(f"trace shard {folder / shard['file']} cannot be read: {error}") from None
        if not SHARD_KEYS <= tensors.keys() or tensors["document"].shape[0] != shard["tokens"]:
            raise SeqMoEError(f"trace shard {folder / shard['file']} is not the one {manifest_file.name} lists; trace again")
        shards.append(tensors)
    try:
        joined = {key: torch.cat([s[key] for s in shards]) for key in shards[0]}
    except (RuntimeError, KeyError):  # shards whose tensors do not line up, or that lack one
        joined = {}
    if not _fits(joined, model):
        raise SeqMoEError(f"the trace shards in {folder} do not hold the shapes of the model {manifest_file.name} names; trace again")
    return Traces(manifest=manifest, **joined)


def _fits(tensors: dict[str, torch.Tensor], model: dict[str, object]) -> bool:
    """Whether the joined shard tensors have the shapes, kinds and expert ids of the traced model."""
    if not tensors:
        return False
    tokens, layers, experts = tensors["document"].shape[0], model["moe_layers"], model["num_experts"]
    shapes = {
        "hidden": (tokens, layers, model["hidden_size"]),
        "experts": (tokens, layers, model["top_k"]),
        "probs": (tokens, layers, experts),
        "decode": (tokens,),
        "paragraph": (tokens,),
    }
    if any(key in tensors and tuple(tensors[key].shape) != shape for key, shape in shapes.items()):
        return False
    routed = tensors["experts"]
    return not routed.is_floating_point() and not routed.is_complex() and (
        routed.numel() == 0 or (int(routed.min()) >= 0 and int(routed.max()) < experts)
    )
