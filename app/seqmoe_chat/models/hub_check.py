"""Check a hub repository before offering its download: fetch ``config.json`` (and
``tokenizer_config.json``) only, ask the engine's loader whether it can run the model, then
list the repository to learn what the download weighs. No weight is requested."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ..engine_import import import_engine
from .hub_errors import INVALID, NO_WEIGHTS, UNSUPPORTED, HubRefusal, describe
from .model_shape import ModelShape, shape_of_skeleton
from .repo_files import HUB_TIMEOUT_S, INDEX_FILE, RemoteFile, download_set, remote_files, total_size

_HUB_URL = re.compile(
    r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/\s?#]+/[^/\s?#]+)"
    r"(?:/(?:tree|blob|resolve)/(?P<revision>[^/\s?#]+))?(?:[/?#]\S*)?$"
)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""Where a repository keeps its chat template when its tokenizer config does not hold it. Not
``chat_template.json``: that is a processor's template, which the tokenizer never reads, so the
loader refuses a repository holding only that one as having no chat template."""
_NOT_MODELS = {"datasets": "a dataset", "spaces": "a Space"}
"""The first part of the hub's other addresses, which its model ids cannot start with."""


@dataclass(frozen=True)
class HubReference:
    repo_id: str
    revision: str = "main"


@dataclass(frozen=True)
class HubModel:
    """A repository the engine can run, with what downloading it takes."""

    reference: HubReference
    architecture: str
    shape: ModelShape
    files: tuple[RemoteFile, ...]
    license: str
    gated: bool | str

    @property
    def download_bytes(self) -> int:
        return total_size(self.files)


def parse_reference(text: str) -> HubReference:
    """``owner/name`` or a hub URL (``https://huggingface.co/owner/name[/tree/revision]``)."""
    text = text.strip()
    match = _HUB_URL.match(text)
    if match:
        repo_id, revision = match["repo"], unquote(match["revision"] or "main")
        if (other := _NOT_MODELS.get(repo_id.split("/")[0])) is not None:
            raise HubRefusal(INVALID, f"{text!r} is {other}, not a model: seqmoe downloads models only")
    else:
        repo_id, revision = text.rstrip("/"), "main"
    if not _is_model_id(repo_id):
        raise HubRefusal(INVALID, f"{text!r} is not a hub id (owner/name) or a huggingface.co model address")
    return HubReference(repo_id, revision)


def _is_model_id(repo_id: str) -> bool:
    """``owner/name`` by huggingface_hub's own rules: an id they refuse fails every later call."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return repo_id.count("/") == 1


def check_repo(reference: HubReference, endpoint: str | None = None) -> HubModel:
    """The model behind ``reference``, or ``HubRefusal`` saying why it cannot be offered."""
    import_engine()
    from huggingface_hub import HfApi
    from seqmoe.errors import ModelRefused
    from seqmoe.hub_files import json_object
    from seqmoe.loader import check_supported, not_for_chat, read_config

    repo_id, revision = reference.repo_id, reference.revision
    with tempfile.TemporaryDirectory() as temporary:
        # Named like the repository: the loader's messages name the folder.
        folder = Path(temporary) / repo_id.split("/")[1]
        try:
            _fetch(reference, "config.json", folder, endpoint)
            _fetch_if_present(reference, "tokenizer_config.json", folder, endpoint)
        except Exception as error:  # noqa: BLE001 - describe() re-raises what it does not know
            raise describe(error, repo_id, revision) from None
        try:
            config = read_config(folder)
            skeleton = check_supported(config)
            shape = shape_of_skeleton(config, skeleton)  # refuses a config without a usable top-k
        except ModelRefused as error:
            raise HubRefusal(UNSUPPORTED, str(error)) from None
        try:
            info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True, timeout=HUB_TIMEOUT_S)
            files = remote_files(info.siblings or [])
            index = None
            if INDEX_FILE in files:
                index = json.loads(_fetch(reference, INDEX_FILE, folder, endpoint).read_text(encoding="utf-8"))
        except Exception as error:  # noqa: BLE001
            raise describe(error, repo_id, revision) from None
        if not (json_object(folder / "tokenizer_config.json").get("chat_template") or CHAT_TEMPLATE_FILE in files):
            # The app would refuse it once downloaded, tens of GB later.
            raise HubRefusal(UNSUPPORTED, str(not_for_chat(repo_id)))
    chosen = download_set(files, index)
    if not any(f.is_weights for f in chosen):
        raise HubRefusal(NO_WEIGHTS, f"{repo_id} has no safetensors weights; seqmoe never loads pickle (.bin) files")
    card = info.card_data
    return HubModel(
        reference=reference,
        architecture=(config.architectures or [type(skeleton).__name__])[0],
        shape=shape,
        files=tuple(chosen),
        license=str(card.get("license", "") if card is not None else "") or "not stated",
        gated=info.gated or False,
    )


def _fetch(reference: HubReference, filename: str, folder: Path, endpoint: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(reference.repo_id, filename, revision=reference.revision, local_dir=folder, endpoint=endpoint))


def _fetch_if_present(reference: HubReference, filename: str, folder: Path, endpoint: str | None) -> None:
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        _fetch(reference, filename, folder, endpoint)
    except RemoteEntryNotFoundError:
        pass


def save_token(token: str) -> None:
    """Validate ``token`` with the hub and keep it in huggingface_hub's own token store, where
    every later request (and every download process) finds it."""
    from huggingface_hub import login
    from huggingface_hub.errors import HfHubHTTPError

    token = token.strip()
    if not token:
        raise HubRefusal(INVALID, "enter an access token (huggingface.co, Settings, Access Tokens)")
    try:
        login(token=token, add_to_git_credential=False)
    except HfHubHTTPError as error:
        if error.response is not None and error.response.status_code == 401:
            raise HubRefusal(INVALID, "the hub refused this token; check that it was copied whole") from None
        raise describe(error, "the token check") from None
    except ValueError as error:  # organisation tokens
        raise HubRefusal(INVALID, str(error)) from None
    except Exception as error:  # noqa: BLE001
        raise describe(error, "the token check") from None
