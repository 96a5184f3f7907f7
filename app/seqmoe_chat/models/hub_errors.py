"""What a failed hub request means to the person who asked, in one line and a kind the UI
acts on (ask for a token, say that downloads need a connection, retry later...)."""

from __future__ import annotations

import errno

GATED = "gated"
NOT_FOUND = "not_found"
OFFLINE = "offline"
UNSUPPORTED = "unsupported"
NO_WEIGHTS = "no_weights"
DISK_FULL = "disk_full"
VERIFY = "verify"
STALLED = "stalled"
FAILED = "failed"
INVALID = "invalid"

RETRYABLE = frozenset({OFFLINE, VERIFY, STALLED, FAILED})
"""Kinds worth an automatic retry: the network or the hub may do better next time."""


class HubRefusal(Exception):
    """A repository cannot be checked or downloaded; ``kind`` says why, the message says what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def hub_url(repo_id: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo_id}"


def describe(error: BaseException, repo_id: str, revision: str = "main") -> HubRefusal:
    """The refusal for an exception raised by huggingface_hub (or by the file system under it)."""
    import httpx2
    from huggingface_hub import get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):  # a subclass of RepositoryNotFoundError: test it first
        if get_token():
            return HubRefusal(GATED, f"the saved access token cannot open {repo_id} yet: accept its licence at "
                                     f"{hub_url(repo_id)} with that account, or enter another token")
        return HubRefusal(GATED, f"{repo_id} is gated: accept its licence at {hub_url(repo_id)}, "
                                 "then enter a Hugging Face access token (it is kept in huggingface_hub's token store)")
    if isinstance(error, RepositoryNotFoundError):
        return HubRefusal(NOT_FOUND, f"no model {repo_id} on the Hugging Face hub (or it is private)")
    if isinstance(error, RevisionNotFoundError):
        return HubRefusal(NOT_FOUND, f"{repo_id} has no revision {revision!r}")
    if isinstance(error, RemoteEntryNotFoundError):
        return HubRefusal(UNSUPPORTED, f"{repo_id} has no config.json: it is not a transformers model")
    # A connection reset or cut in the middle of a file (NetworkError) is the network's, as is one never made.
    if isinstance(error, (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx2.NetworkError, httpx2.TimeoutException,
                          httpx2.RemoteProtocolError)):
        return HubRefusal(OFFLINE, "the Hugging Face hub cannot be reached: downloads need a connection "
                                   "(models already on this computer work as usual)")
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "an error"
        return HubRefusal(FAILED, f"the hub answered {status} for {repo_id}; try again later")
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return HubRefusal(DISK_FULL, "the disk is full: free some space, then resume the download")
    if isinstance(error, OSError):
        where = f" ({error.filename})" if error.filename else ""
        return HubRefusal(FAILED, f"{repo_id} could not be downloaded: {error.strerror or error}{where}")
    raise error
