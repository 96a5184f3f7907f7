"""A stand-in for the Hugging Face hub on 127.0.0.1, in the hub's URL layout, so that
huggingface_hub talks to it unchanged (``HF_ENDPOINT``). It serves repositories from local
folders and can misbehave on purpose: gate a repository behind a token, drop a connection
in the middle of a file, stall, or send slowly."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

TOKEN = "hf_seqmoe_test_token"
CHUNK = 16 * 1024


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated: bool = False


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    drop_once: set[str] = field(default_factory=set)  # files whose first GET stops at 90%
    stall_once: dict[str, float] = field(default_factory=dict)  # files whose first GET hangs at 90%
    chunk_delay_s: float = 0.0  # per 16 KiB of a file's body
    listing_delay_s: float = 0.0  # before a repository's file listing (model_info)

    def add(self, repo_id: str, folder: Path, gated: bool = False) -> Repo:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        commit = hashlib.sha1(repo_id.encode() + b"".join(files.values())).hexdigest()
        self.repos[repo_id] = repo = Repo(files, commit, gated)
        return repo

    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-hub").start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def file_requests(self, suffix: str = "") -> list[Seen]:
        return [r for r in self.requests if "/resolve/" in r.path and r.path.endswith(suffix)]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append(Seen(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path == "/api/whoami-v2":
            return self._whoami()
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if info:
            return self._model_info(info[1])
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
        if tree:
            return self._tree(tree[1])
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if resolve:
            return self._file(resolve[1], resolve[3], body)
        self._error(404, "RepoNotFound", "not a hub address")

    def _authorized(self) -> bool:
        return self.headers.get("authorization") == f"Bearer {TOKEN}"

    def _whoami(self) -> None:
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        self._json({"name": "tester", "type": "user", "auth": {"accessToken": {"displayName": "seqmoe-test", "role": "read"}}})

    def _model_info(self, repo_id: str) -> None:
        time.sleep(self.hub.listing_delay_s)
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for {repo_id}")
        siblings = []
        for entry in _entries(repo):
            sibling = {"rfilename": entry["path"], "size": entry["size"], "blobId": entry["oid"]}
            if "lfs" in entry:
                sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"], "pointerSize": 134}
            siblings.append(sibling)
        self._json({"id": repo_id, "sha": repo.commit, "gated": "manual" if repo.gated else False, "private": False,
                    "siblings": siblings, "cardData": {"license": "apache-2.0"}, "tags": []})

    def _tree(self, repo_id: str) -> None:
        """Every file of the repository (as ``snapshot_download`` lists it, recursively, in one page)."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for {repo_id}")
        self._json([{"type": "file", **entry} for entry in _entries(repo)])

    def _file(self, repo_id: str, name: str, body: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for {repo_id}")
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must be authenticated.")
        if name not in repo.files:
            return self._error(404, "EntryNotFound", f"{name} does not exist")
        data = repo.files[name]
        start = 0
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("range", ""))
        if ranged:
            start = int(ranged[1])
        self.send_response(206 if ranged else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) - start))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        part = data[start:]
        cut = len(part) * 9 // 10  # past the first MiB, which the client writes at once
        if name in self.hub.drop_once and start == 0:
            self.hub.drop_once.discard(name)
            self._send(part[:cut])
            self.close_connection = True
            return
        stall = self.hub.stall_once.pop(name, None) if start == 0 else None
        if stall is not None:
            self._send(part[:cut])
            time.sleep(stall)
            self.close_connection = True
            return
        self._send(part)

    def _send(self, data: bytes) -> None:
        for offset in range(0, len(data), CHUNK):
            try:
                self.wfile.write(data[offset : offset + CHUNK])
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return
            if self.hub.chunk_delay_s:
                time.sleep(self.hub.chunk_delay_s)

    def _json(self, value: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        for name, header in (headers or {}).items():
            self.send_header(name, header)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Code": code} if code else {}
        self._json({"error": message}, status, {**headers, "X-Error-Message": message})


def _entries(repo: Repo) -> list[dict[str, object]]:
    """Each file as the hub's tree lists it: path, size, git blob id and, for weights (stored with
    Git LFS), the LFS object (its ``oid`` is the sha256)."""
    entries = []
    for name, data in repo.files.items():
        entry: dict[str, object] = {"path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
        if name.endswith(".safetensors"):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        entries.append(entry)
    return entries
