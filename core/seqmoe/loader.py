"""Open a Hugging Face MoE model for offloaded inference, or refuse it in one clear line.

Two steps, as in vLLM's loaders: ``resolve`` finds the files (a local folder, or a hub id
downloaded through huggingface_hub), ``load_model`` checks and loads them. Every check
that can be made before reading gigabytes of weights is made first, on a model built on
the meta device. Remote code is never executed: a model that asks for it is refused.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil
import torch
import transformers
from huggingface_hub.errors import HFValidationError, StrictDataclassError
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Mxfp4Config,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)
from transformers.utils import SAFE_WEIGHTS_NAME

from .counts import is_count
from .errors import ModelRefused, SeqMoEError
from .hub_files import IN_A_FOLDER, INDEX_FILE, SMALL_PATTERNS, WEIGHT_PATTERN, indexed_weights, json_object, model_name
from .layer_configs import largest_int
from .non_finite import first_non_finite
from .pinned import CudaHostRegistry, PinnedBuffers
from .store import HostStore, expert_parameters

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""The config keys that transformers' MoE architectures name their routed-expert count by."""
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "top_k_experts")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEQUANTIZED_ON_LOAD: dict[str, Callable[[], object]] = {"mxfp4": lambda: Mxfp4Config(dequantize=True)}
"""Quantized checkpoint formats that transformers turns into plain weights while loading (gpt-oss
ships MXFP4 experts), and the loading option that asks for it (made afresh for each load): the
engine copies and computes plain expert tensors, and without it transformers would swap in its
own quantized experts module or demand packages (accelerate, kernels) only for that."""


@dataclass
class LoadedModel:
    """A model whose non-expert weights are on ``device`` and whose experts are in ``host``."""

    path: Path
    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    experts: list[nn.Module]
    host: HostStore
    base_implementation: str
    device: torch.device
    top_k: int

    @property
    def name(self) -> str:
        """The model's name for people (``owner/name`` for one in the Hugging Face cache)."""
        return model_name(self.path)

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def context_limit(self) -> int | None:
        return context_limit(self.config)

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer can put a conversation into the model's turns."""
        return bool(self.tokenizer.chat_template)

    @property
    def end_token_ids(self) -> list[int]:
        """The tokens ``generate`` ends a reply at: the generation config's EOS ids."""
        ends = self.model.generation_config.eos_token_id
        return [] if ends is None else [ends] if isinstance(ends, int) else list(ends)

    def check_chat_template(self, remedy: str = "use a plain prompt") -> None:
        """Refuse chat input, in one line, for a model whose tokenizer has no chat template; ``remedy``
        says what the caller's user can do instead."""
        if not self.has_chat_template:
            raise SeqMoEError(f"{self.name} has no chat template; {remedy}")

    @property
    def resident_bytes(self) -> int:
        expert_ids = _expert_parameter_ids(self.experts)
        tensors = [p for p in self.model.parameters() if id(p) not in expert_ids] + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)


def context_limit(config: PretrainedConfig) -> int | None:
    """The most positions (prompt and reply) the model was built for, when its config says."""
    value = getattr(config.get_text_config(), "max_position_embeddings", None)
    return value if is_count(value, 1) else None


def resolve(model: str) -> Path:
    """A local folder for ``model`` (a path, or a hub id fetched or found in the HF cache)."""
    try:
        path = Path(model).expanduser()
        exists = path.exists()
    except (RuntimeError, ValueError):  # ~name of a user this computer does not have; a NUL in the name
        raise ModelRefused(f"no such model folder: {model}") from None
    except OSError as error:  # a name too long for the file system, a folder this user may not enter
        raise ModelRefused(f"model folder {model} cannot be read: {error.strerror or error}") from None
    if exists:
        if not path.is_dir():
            raise ModelRefused(f"{model} is a file; give the model's folder")
        return path
    if not _REPO_ID.match(model) or model.startswith((".", "/", "~")):
        raise ModelRefused(f"no such model folder: {model}")
    try:
        validate_repo_id(model)  # the hub's own rules, stricter than _REPO_ID (no "--", at most 96 characters)
    except HFValidationError as error:
        raise ModelRefused(f"no such model folder: {model}, nor a hub id: {_first_line(error)}") from None
    return _download(model)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        # The configs and the index first: the weights are the files the index names (see ``hub_files``).
        small = Path(snapshot_download(repo_id, allow_patterns=list(SMALL_PATTERNS), ignore_patterns=IN_A_FOLDER))
        shards = indexed_weights(small)
        weights = [shard.name for shard in shards] if shards is not None else [WEIGHT_PATTERN]
        return Path(snapshot_download(repo_id, allow_patterns=weights, ignore_patterns=IN_A_FOLDER))
    except GatedRepoError:
        raise ModelRefused(
            f"{repo_id} is gated: accept its licence on the hub, then log in with `hf auth login`"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelRefused(f"no model {repo_id} on the Hugging Face hub (or it is private)") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise ModelRefused(
            f"{repo_id} is not downloaded and the hub cannot be reached (offline); "
            "connect, or give a local folder"
        ) from None
    except OSError as error:
        raise ModelRefused(f"downloading {repo_id} failed: {error}") from None


def read_config(path: Path) -> PretrainedConfig:
    """The model's config, refused if it is missing, holds a number that is not finite, asks for
    remote code, or is unknown."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelRefused(f"{path} is not a Hugging Face model folder (no config.json)")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # decoding errors are ValueErrors; deep nesting recurses too far
        raise ModelRefused(f"{config_file} is not valid JSON: {error}") from None
    except OSError as error:
        raise ModelRefused(f"{config_file} cannot be read: {error.strerror or error}") from None
    if not isinstance(raw, dict):
        raise ModelRefused(f"{config_file} is not a model config (a JSON object)")
    if (found := first_non_finite(raw)) is not None:
        key, value = found  # json.dumps names it in JSON's words: NaN, Infinity, -Infinity
        raise ModelRefused(
            f"config.json of {path.name}: {key} is {json.dumps(value)}; a model's config holds finite numbers"
        )
    # A model may ship its own code (auto_map) for an architecture that transformers now
    # implements itself (DeepSeek-V2, Phi-3.5-MoE): then the built-in classes are used and the
    # shipped code is ignored, as transformers does without trust_remote_code. Otherwise the
    # model needs that code, and it is never run.
    model_type = raw.get("model_type")
    native = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    for name in () if native else ("config.json", "tokenizer_config.json"):
        if "auto_map" in (raw if name == "config.json" else json_object(path / name)):  # config.json read once
            raise ModelRefused(
                f"{path.name} needs its own remote code ({name} has auto_map and transformers has no built-in "
                f"{raw.get('model_type', 'unknown')!r} architecture); seqmoe never runs code shipped with a model"
            )
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except StrictDataclassError as error:  # a field of the wrong type, checked by the config class
        raise ModelRefused(f"{config_file} has a value transformers refuses: {' '.join(str(error).split())}") from None
    except (ValueError, KeyError) as error:
        model_type = raw.get("model_type", "unknown")
        raise ModelRefused(
            f"architecture {model_type!r} is not supported by the installed transformers: {_first_line(error)}"
        ) from None
    except Exception as error:  # a value of a type the config class does not expect, met with whatever error it raises
        raise ModelRefused(
            f"{config_file} has a value transformers cannot read: {type(error).__name__}: {_first_line(error)}"
        ) from None


def find_experts(model: nn.Module) -> list[nn.Module]:
    """Experts modules built with transformers' ``use_experts_implementation``, in forward order."""
    return [m for m in model.modules() if isinstance(getattr(m, "is_concatenated", None), bool) and hasattr(m, "has_gate")]


def check_supported(config: PretrainedConfig) -> nn.Module:
    """Refuse models that are not MoEs, or whose experts bypass the experts interface.

    Returns the model it checked, built on the meta device (no memory), so that a caller
    can measure the model (experts, their sizes) before any weight is downloaded.
    """
    causal_lm = _file_causal_lm_filed_elsewhere(config) or config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as error:  # building from the config alone: any error means the config is unusable
        if causal_lm:
            raise ModelRefused(
                f"transformers cannot build a {config.model_type!r} model from this config.json: "
                f"{type(error).__name__}: {_first_line(error)}"
            ) from None
        raise ModelRefused(
            f"{config.model_type!r} is {_kind_of_model(config.model_type)}, not a text-only causal language model "
            "(transformers has no ...ForCausalLM class for it); seqmoe runs causal language models"
        ) from None
    architecture = type(skeleton).__name__
    method = quantization_method(config)
    if method is not None and method not in DEQUANTIZED_ON_LOAD:
        raise ModelRefused(
            f"this {architecture} checkpoint is stored {method}-quantized; seqmoe offloads unquantized experts "
            f"(or {', '.join(DEQUANTIZED_ON_LOAD)}, which it dequantizes): use the model's bf16 release"
        )
    if find_experts(skeleton):
        return skeleton
    layers = getattr(config.get_text_config(), "num_hidden_layers", None)
    if is_count(layers) and layers < 1:  # and so no experts: the config's fault, not the architecture's
        raise ModelRefused(f"the config.json of this {architecture} has no layers (num_hidden_layers {layers})")
    if declares_experts(config):
        raise ModelRefused(
            f"{architecture} is an MoE whose experts do not use transformers' experts interface; "
            "seqmoe cannot offload it"
        )
    raise ModelRefused(f"{architecture} is not a Mixture-of-Experts model; seqmoe offloads MoE experts only")


def _file_causal_lm_filed_elsewhere(config: PretrainedConfig) -> bool:
    """Let ``AutoModelForCausalLM`` build and load a text-only model whose ``...ForCausalLM`` class
    transformers files only under image-text-to-text (Mistral 4's), and say whether it did: the
    model was refused as "an image-and-text model" though it runs as any other."""
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return False
    name = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(config.model_type)
    model_class = getattr(transformers, name, None) if isinstance(name, str) and name.endswith("ForCausalLM") else None
    if model_class is None:
        return False
    try:
        AutoModelForCausalLM.register(type(config), model_class, exist_ok=True)
    except ValueError:  # a class for another config than the model type's: as transformers files it
        return False
    return True


def declares_experts(config: PretrainedConfig) -> bool:
    """Whether the config, or a config nested in it (DBRX keeps its experts in ``ffn_config``),
    names more than one routed expert."""
    nested = [value for value in vars(config).values() if isinstance(value, PretrainedConfig)]
    return largest_int(config, EXPERT_COUNT_KEYS) > 1 or any(map(declares_experts, nested))


def _kind_of_model(model_type: str) -> str:
    """What kind of model transformers files this model type under, in words."""
    for names, kind in (
        (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, "an image-and-text model"),
        (MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES, "a multimodal model"),
        (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "an encoder-decoder model"),
    ):
        if model_type in names:
            return kind
    return "a model of another kind"


def quantization_method(config: PretrainedConfig) -> str | None:
    """How the checkpoint's weights are quantized (``quant_method``), or ``None`` for plain weights."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization, "quant_method", None)
    return str(getattr(method, "value", method) or "unknown")


def check_weights(path: Path, skeleton: nn.Module, config: PretrainedConfig) -> list[Path]:
    """The safetensors files transformers loads the checkpoint from, refused if any is missing or
    truncated, or holds a weight of another size or kind than ``skeleton`` (built from config.json)
    gives it, or if together they hold far fewer weights than it has."""
    shards = indexed_weights(path)
    if shards == []:
        raise ModelRefused(f"{INDEX_FILE} in {path} is damaged: it names no weight files")
    # Only the files transformers opens, in its order: any other *.safetensors (an adapter's, say)
    # beside pickle weights does not make a safetensors checkpoint. First of all it opens the file
    # config.json names (``transformers_weights``), whatever else is there.
    named = getattr(config, "transformers_weights", None)
    if named is not None and named not in (SAFE_WEIGHTS_NAME, INDEX_FILE):
        raise ModelRefused(
            f"the config.json of {path.name} names {named!r} for its weights (transformers_weights); seqmoe loads "
            f"only {SAFE_WEIGHTS_NAME} or {INDEX_FILE} and its shards, safetensors, which cannot run code"
        )
    single = path / SAFE_WEIGHTS_NAME
    files = [single] if single.is_file() and named != INDEX_FILE else shards
    if files is None:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise ModelRefused(
                f"{path.name} has only pickle weights (.bin); seqmoe loads safetensors only, which cannot run code"
            )
        raise ModelRefused(f"no weight files ({SAFE_WEIGHTS_NAME}, or {INDEX_FILE} and its shards) in {path}")
    stored: dict[str, _Stored] = {}
    for file in files:
        if not file.is_file():
            raise ModelRefused(f"weight file {file.name} is missing from {path}")
        stored.update(_read_safetensors_header(file))
        try:  # safetensors' own checks, made as it opens a file: each tensor's bytes fit its dtype and shape, say
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError as error:
            raise ModelRefused(
                f"loading the weights of {path.name} failed on {file.name}: {_first_line(error)}"
            ) from None
    missing = _missing_expert_weights(stored)
    if missing:
        raise _lacks(path.name, missing)
    if quantization_method(config) is None:  # quantized weights are stored under other names, sizes and dtypes
        _check_sizes(path.name, skeleton, stored)
        _check_dtypes(path.name, skeleton, stored)
        _check_filled(path.name, skeleton, config, stored)
    return files


_PER_EXPERT = re.compile(r"(?P<experts>.+\.experts)\.(?P<number>\d+)\.(?P<weight>.+)")


def _missing_expert_weights(stored: dict[str, _Stored]) -> list[str]:
    """The weights a checkpoint storing each expert apart (``...experts.3.w1.weight``) lacks below a
    layer's highest expert number. transformers stacks the experts it finds into one tensor and
    reports the gap as a tensor of another size than the config gives, or as a failed conversion;
    experts missing above the highest number cannot be told from a config asking for more."""
    layers: dict[str, dict[str, set[int]]] = {}
    for key in stored:
        match = _PER_EXPERT.fullmatch(key)
        if match:
            layers.setdefault(match["experts"], {}).setdefault(match["weight"], set()).add(int(match["number"]))
    missing = []
    for experts, weights in sorted(layers.items()):
        highest = max(max(numbers) for numbers in weights.values())
        for number in range(highest + 1):
            missing += [f"{experts}.{number}.{weight}" for weight, numbers in sorted(weights.items()) if number not in numbers]
    return missing


def _lacks(name: str, missing: list[str]) -> ModelRefused:
    more = f" and {len(missing) - 1} more weights" if len(missing) > 1 else ""
    return ModelRefused(f"the checkpoint of {name} lacks {missing[0]}{more}")


def _check_sizes(name: str, skeleton: nn.Module, stored: dict[str, _Stored]) -> None:
    """Refuse, before any weight is read, stored weights of other sizes than the model's. Only the
    names both use are compared, and only by element count: transformers renames, fuses and
    reshapes some weights as it loads them (a Mixtral's per-expert weights, say), and what it
    cannot match is named after loading (``mismatched_keys``)."""
    params = skeleton.state_dict()
    mismatched = [
        (key, entry.shape, list(params[key].shape))
        for key, entry in sorted(stored.items())
        if key in params and math.prod(entry.shape) != params[key].numel()
    ]
    if mismatched:
        raise _shapes_differ(name, mismatched)


def _check_dtypes(name: str, skeleton: nn.Module, stored: dict[str, _Stored]) -> None:
    """Refuse integers stored for the model's floating-point weights (its own, or per-expert weights
    that transformers fuses into one): transformers takes them for the numbers they say, and the
    model answers garbage. Such a header lies (I32 said of float32 bytes), or the checkpoint is
    quantized though its config.json does not say so."""
    floats = {key for key, tensor in skeleton.state_dict().items() if tensor.is_floating_point()}
    wrong = [
        (key, entry.dtype)
        for key, entry in sorted(stored.items())
        if entry.dtype in _INTEGERS and (key in floats or _PER_EXPERT.fullmatch(key))
    ]
    if wrong:
        key, dtype = wrong[0]
        raise ModelRefused(
            f"{len(wrong)} weights of {name} are stored as integers where the model has floating-point numbers, e.g. "
            f"{key}: {dtype}; the checkpoint's header is corrupt, or the checkpoint is quantized and its config.json "
            "does not say so"
        )


FILLED_SLACK = 1.1


def _check_filled(name: str, skeleton: nn.Module, config: PretrainedConfig, stored: dict[str, _Stored]) -> None:
    """Refuse a config that describes more weights than the checkpoint holds (more layers or experts):
    transformers would allocate all of them (gigabytes, for a config asking for 10000 layers) before
    finding them missing. They are counted, not named, as transformers renames and fuses weights as
    it loads them; the weights it lets a checkpoint lack (``_keys_to_ignore_on_load_missing``) are
    left out of the count."""
    optional = getattr(skeleton, "_keys_to_ignore_on_load_missing", None) or []
    described = sum(
        param.numel() for key, param in skeleton.named_parameters() if not any(re.search(p, key) for p in optional)
    )
    held = sum(math.prod(entry.shape) for entry in stored.values())
    # A tenth of slack: a weight or two that a real checkpoint lacks (transformers initialises it and
    # says so after loading, as the loader reports) must not refuse it here; a config asking for
    # more layers or experts than there are asks for far more.
    if described > held * FILLED_SLACK:
        layers = getattr(config.get_text_config(), "num_hidden_layers", "?")
        experts = largest_int(config, EXPERT_COUNT_KEYS)
        raise ModelRefused(
            f"the weights of {name} do not have the shapes its config.json gives: {held:,} parameters in the "
            f"checkpoint, {described:,} from the config ({layers} layers of up to {experts} experts); the config was "
            "changed, or the weights belong to another model"
        )


def _shapes_differ(name: str, mismatched: list[tuple[str, list[int], list[int]]]) -> ModelRefused:
    key, stored, expected = mismatched[0]
    return ModelRefused(
        f"{len(mismatched)} weights of {name} do not have the shapes its config.json gives, e.g. "
        f"{key}: {list(stored)} in the checkpoint, {list(expected)} from the config; the config was changed, "
        "or the weights belong to another model"
    )


def weights_bytes(skeleton: nn.Module, files: list[Path], dtype: str | None) -> int:
    """Host memory the weights take once loaded: the parameters (``skeleton``, built by
    ``check_supported``) at ``dtype``; else at the config's dtype, which transformers loads them in
    (a bfloat16 checkpoint whose config says float32 takes twice its files), and never less than
    the checkpoint's files as they are (loaded in their own dtype when the config names none)."""
    if dtype is not None:
        return sum(param.numel() for param in skeleton.parameters()) * DTYPES[dtype].itemsize
    files_bytes = sum(file.stat().st_size for file in files)
    if skeleton.config.dtype is None:
        return files_bytes
    return max(files_bytes, sum(param.numel() * param.element_size() for param in skeleton.parameters()))


def check_ram_size(name: str, need: int, dtype: str | None) -> None:
    """Refuse weights larger than this computer's RAM: every weight is loaded into host memory and
    the experts stay there (a share of them fits in VRAM)."""
    total = psutil.virtual_memory().total
    if need > total:
        weights, smaller = _weights_and_remedy(name, need, dtype)
        raise ModelRefused(
            f"{weights} and this computer has {total / 2**30:.1f} GiB of RAM; "
            f"seqmoe keeps every expert in RAM, so choose a smaller model{smaller}"
        )


def check_free_memory(name: str, need: int, dtype: str | None) -> None:
    """Refuse weights larger than the memory free now, before reading them: a load past the free
    memory and swap ends with the system killing the process."""
    memory = psutil.virtual_memory()
    free = memory.available + psutil.swap_memory().free
    if need > free:
        weights, smaller = _weights_and_remedy(name, need, dtype)
        raise ModelRefused(
            f"{weights} and {free / 2**30:.1f} GiB of RAM and swap is free now "
            f"(of {memory.total / 2**30:.1f} GiB of RAM); close other programs, or choose a smaller model{smaller}"
        )


def _weights_and_remedy(name: str, need: int, dtype: str | None) -> tuple[str, str]:
    smaller = " (or a smaller dtype than float32)" if dtype == "float32" else ""
    return f"{name}'s weights take {need / 2**30:.1f} GiB", smaller


class _Stored(NamedTuple):
    """A tensor as a safetensors header describes it."""

    dtype: str
    shape: list[int]


_INTEGERS = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}


def _read_safetensors_header(file: Path) -> dict[str, _Stored]:
    """Each stored tensor's dtype and shape, refused if the file is truncated or its header corrupt."""
    try:
        size = file.stat().st_size
        handle = file.open("rb")
    except OSError as error:
        raise ModelRefused(f"weight file {file.name} cannot be read: {error.strerror or error}") from None
    with handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ModelRefused(f"weight file {file.name} is truncated ({size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise ModelRefused(f"weight file {file.name} is truncated or not safetensors")
        try:
            header = json.loads(handle.read(header_len))  # JSON errors are ValueErrors; deep nesting recurses too far
            tensors = {key: entry for key, entry in header.items() if key != "__metadata__"}
            end = max((_data_end(entry) for entry in tensors.values()), default=0)
            stored = {key: _stored(entry) for key, entry in tensors.items()}
        except (ValueError, AttributeError, KeyError, TypeError, RecursionError):
            raise ModelRefused(f"weight file {file.name} has a corrupt header") from None
    if 8 + header_len + end > size:
        raise ModelRefused(
            f"weight file {file.name} is truncated: {size} bytes, its header promises {8 + header_len + end}"
        )
    return stored


def _stored(tensor: dict) -> _Stored:
    """A header entry's tensor; a ``TypeError`` for an entry that is no tensor's."""
    shape = tensor["shape"]
    if not isinstance(shape, list) or not all(isinstance(size, int) for size in shape):
        raise TypeError("a shape that is no list of integers")
    return _Stored(tensor["dtype"], shape)


def _data_end(tensor: dict) -> int:
    """Where a header entry's bytes end; a ``TypeError`` for an entry that is no tensor's."""
    start, end = tensor["data_offsets"]
    if not isinstance(end, int) or not isinstance(start, int):
        raise TypeError("data offsets are not integers")
    return end


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    # Tokenizer files of any shape are read as they come: a list where an object goes, say, fails
    # with whatever error that raises (AttributeError, a RecursionError for deep nesting).
    except Exception as error:
        raise ModelRefused(f"no usable tokenizer in {path}: {_first_line(error)}") from None
    # Without any tokenizer file, transformers builds the model type's tokenizer with an empty vocabulary.
    if not tokenizer("Hello", add_special_tokens=False)["input_ids"]:
        raise ModelRefused(f"no usable tokenizer in {path}: it encodes no text (are its tokenizer files missing?)")
    return tokenizer


def top_k_of(config: PretrainedConfig) -> int:
    """How many experts a token uses (the most any layer uses, when layers differ), refused unless
    at least 1 and at most the experts there are (more fail only while generating)."""
    top_k = largest_int(config, _TOP_K_KEYS)
    if not top_k:
        raise ModelRefused(f"{type(config).__name__} does not say how many experts each token uses (at least 1)")
    experts = largest_int(config, EXPERT_COUNT_KEYS)
    if top_k > experts > 0:
        raise ModelRefused(f"{type(config).__name__} gives each token {top_k} experts, more than the {experts} it has")
    return top_k


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        # The app's settings and the command line both reach this: name the fix, not a flag.
        if torch.version.cuda is None:
            raise ModelRefused(
                "the CUDA GPU was asked for, but this PyTorch is a CPU-only build: install PyTorch's CUDA build "
                "(pytorch.org, Get Started), or run on the CPU"
            )
        raise ModelRefused(
            f"the CUDA GPU was asked for, but PyTorch (built for CUDA {torch.version.cuda}) finds no working "
            "NVIDIA GPU and driver; run on the CPU, or check the driver (nvidia-smi)"
        )
    if device not in ("cpu", "cuda"):
        raise ModelRefused(f"unknown device {device!r}; choose auto, cpu or cuda")
    return torch.device(device)


@dataclass(frozen=True)
class CheckedModel:
    """A model folder that passed every check made without reading a weight."""

    path: Path
    config: PretrainedConfig
    skeleton: nn.Module
    """The model built on the meta device (see ``check_supported``)."""
    files: list[Path]
    tokenizer: PreTrainedTokenizerBase
    top_k: int


def check_model(path: Path) -> CheckedModel:
    """Check a model folder without reading a weight or taking memory: its config (no remote
    code), that it is an MoE seqmoe can offload, its weight files (all there, whole, of the
    sizes the config gives), its tokenizer."""
    config = read_config(path)
    skeleton = check_supported(config)
    files = check_weights(path, skeleton, config)
    top_k = top_k_of(config)
    return CheckedModel(path, config, skeleton, files, load_tokenizer(path), top_k)


Progress = Callable[[str, float], None]
"""Told (stage, fraction done) between loading stages; it may raise to cancel the load."""


def not_for_chat(name: str) -> ModelRefused:
    """The refusal of model ``name``, whose tokenizer has no chat template, by a chat."""
    return ModelRefused(f"{name} has no chat template: it is not made for chat (a base model, not a chat or "
                        "instruct one); load a chat model, or give it plain text with `seqmoe generate`")


def load_model(
    model: str,
    device: str = "auto",
    dtype: str | None = None,
    on_progress: Progress | None = None,
    on_checked: Callable[[], None] | None = None,
    for_chat: bool = False,
) -> LoadedModel:
    """Open ``model`` with its experts in host memory and everything else on ``device``; with
    ``for_chat``, only a model whose tokenizer has a chat template (a chat app has no other input).

    ``on_checked`` is called once the checks that take no memory have passed (files, config,
    architecture, tokenizer), before free memory is measured and any weight is read: a caller
    holding another model lets it go there, so that a model refused by those checks leaves the
    other one loaded, and a model that loads finds the memory free."""
    progress = on_progress or (lambda stage, fraction: None)
    target = pick_device(device)
    if dtype is not None and dtype not in DTYPES:
        raise ModelRefused(f"unknown dtype {dtype!r}; choose {', '.join(DTYPES)}")
    progress("Finding the model", 0.0)
    path = resolve(model)
    progress("Checking the model", 0.05)
    checked = check_model(path)
    if for_chat and not checked.tokenizer.chat_template:
        raise not_for_chat(model_name(path))
    need = weights_bytes(checked.skeleton, checked.files, dtype)
    check_ram_size(path.name, need, dtype)
    if on_checked is not None:
        on_checked()
    check_free_memory(path.name, need, dtype)
    progress("Loading the weights", 0.15)
    method = quantization_method(checked.config)
    options = {"quantization_config": DEQUANTIZED_ON_LOAD[method]()} if method is not None else {}
    try:
        # Mismatched shapes are let through to be told below by name: transformers' own error
        # only points at a report it logged, which an app's user never sees.
        hf_model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype] if dtype else "auto", trust_remote_code=False, output_loading_info=True,
            ignore_mismatched_sizes=True, use_safetensors=True, **options
        )
    except (OSError, ValueError, RuntimeError, ImportError, SafetensorError) as error:
        raise ModelRefused(f"loading the weights of {path.name} failed: {_first_line(error)}") from None
    if info["missing_keys"]:
        raise _lacks(path.name, sorted(info["missing_keys"]))
    if info["mismatched_keys"]:
        raise _shapes_differ(path.name, sorted(info["mismatched_keys"], key=lambda entry: entry[0]))
    hf_model.eval()
    experts = find_experts(hf_model)
    progress("Keeping the experts in host memory", 0.7)

    def layer_kept(done: int) -> None:  # packing takes a while on large models: the bar moves, Cancel works
        progress(f"Keeping the experts in host memory (layer {done} of {len(experts)})", 0.7 + 0.15 * done / len(experts))

    try:
        host = HostStore(experts, PinnedBuffers(CudaHostRegistry()) if target.type == "cuda" else None, on_layer=layer_kept)
    except ValueError as error:
        raise ModelRefused(f"{type(hf_model).__name__}: {error}; seqmoe needs one expert shape") from None
    except RuntimeError as error:  # pinning: the driver could not lock that much host memory
        raise ModelRefused(
            f"the experts of {path.name} could not be pinned in host memory for fast copies ({_first_line(error)}); "
            "close other programs to free RAM, or run on the CPU"
        ) from None
    progress(f"Moving the other weights to {target.type}", 0.85)
    try:
        _place(hf_model, experts, target)
    except torch.OutOfMemoryError:
        raise ModelRefused(
            f"{path.name}'s non-expert weights do not fit in {target.type} memory; free device memory, or run on the CPU"
        ) from None
    progress("Ready", 1.0)
    return LoadedModel(
        path=path,
        model=hf_model,
        tokenizer=checked.tokenizer,
        experts=experts,
        host=host,
        base_implementation=hf_model.config._experts_implementation,
        device=target,
        top_k=checked.top_k,
    )


def _expert_parameter_ids(experts: list[nn.Module]) -> set[int]:
    return {id(param) for module in experts for param in expert_parameters(module).values()}


def _place(model: nn.Module, experts: list[nn.Module], device: torch.device) -> None:
    """Every tensor but the experts' (the host store's since it was built) moves to ``device``."""
    expert_params = _expert_parameter_ids(experts)
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in expert_params:
                param.data = param.data.to(device)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None:
                module._buffers[name] = buffer.to(device)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
