#!/usr/bin/env python3
"""A stand-in for huggingface.co's model-download HTTP API, as the huggingface_hub 1.28.0 client reads it.

Standard library only (Python 3.11): it is copied alone into the lab's Debian 12 container and run there
with the system python3 on the container's loopback (``python3 hub.py --root DIR --port N``), and it runs
in-process in the unit tests (``Hub(root).start()``). The real client talks to it through ``endpoint=`` or
``HF_ENDPOINT``: ``snapshot_download`` (also ``dry_run=True``), ``hf_hub_download``, ``HfApi.model_info``,
``HfApi.list_repo_tree``, ``HfApi.get_paths_info``.

Repositories: ``<root>/<org>/<name>/`` holds the files of one commit of the model repo ``org/name``
(nested folders allowed; files and folders whose name starts with ``.hub`` are not repo content, the hash
cache ``.hub-hashes.json`` lives there). The commit id is :func:`commit_of`: the same bytes give the same
commit on any machine. ``*.safetensors`` and any file of 1 MiB or more are LFS files, as git-lfs would
track them on the Hub: their ``oid`` is the git blob sha1 of their LFS pointer (as the Hub lists it), their
``lfs.oid`` the sha256 of the content; any other file's ``oid`` is the git blob sha1 of its content.

Routes (``rev`` is ``main`` or the 40-hex commit):

  GET  /api/models/{org}/{name}[/revision/{rev}]      model_info (``blobs``, ``expand``, ``securityStatus``)
  GET  /api/models/{org}/{name}/tree/{rev}[/{path}]   list_repo_tree, paged by ``Link: <..>; rel="next"``
  POST /api/models/{org}/{name}/paths-info/{rev}      get_paths_info
  HEAD|GET /{org}/{name}/resolve/{rev}/{path}         file metadata / bytes; LFS files 302 to /_lfs/{sha256}
  HEAD|GET /_lfs/{sha256}                             LFS bytes (the CDN's part), ``Range`` honoured
  GET|DELETE /_lab/log, GET|POST /_lab/faults         the lab's controls (see Hub.log and Hub.faults)

Every route, header and error below cites the client line that reads it (paths relative to
``site-packages/huggingface_hub/`` of 1.28.0). The stand-in offers no Xet: the client only goes to Xet when
a HEAD answer carries ``X-Xet-Hash`` (utils/_xet.py:50-56) or a tree entry carries ``xetHash``
(file_download.py:1850-1862); without them it downloads with plain HTTP GET (file_download.py:1959-1983),
hf_xet installed or not: no header is needed to fall back.

NOT implemented: Xet (CAS, ``X-Xet-*``, ``xetHash``), uploads and commits (preupload, LFS batch, commit
API), datasets, spaces, kernels and buckets (their API routes answer RepoNotFound), branches other than
``main``, tags, ``refs/pr/N``, commit history (``list_repo_commits``, ``list_repo_refs``), repos without an
org (``gpt2``), repo renames (relative redirects), repo cards, search and listing (``list_models``),
``/api/whoami``, per-user access (one token for everything), file security scans (always "safe"), gzip,
multi-range requests (answered with the whole file, as RFC 9110 allows), TLS.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import ipaddress
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LFS_THRESHOLD = 1024 * 1024          # files this big or bigger are LFS files, and every *.safetensors
LFS_SUFFIXES = (".safetensors",)
HIDDEN_PREFIX = ".hub"               # names starting with this are not repo content
HASH_CACHE = ".hub-hashes.json"      # per repo folder: path -> [size, mtime_ns, kind, digest]
DEFAULT_PAGE_SIZE = 2                # the Hub pages /tree by 1000 (50 with expand); small here so paging runs
LOG_LIMIT = 100_000
SEND_CHUNK = 1 << 20
BRANCH = "main"
LFS_SPEC = "https://git-lfs.github.com/spec/v1"

# hf_raise_for_status (utils/_http.py:865-868) leaves a 401 carrying exactly this message out of its
# RepoNotFound branch: the Hub's answer to a token it does not know. The client then raises a plain
# HfHubHTTPError with the status 401 (utils/_http.py:928), which snapshot_download re-raises
# (_snapshot_download.py:365-369) and hf_hub_download too (file_download.py:1900-1905).
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"

# HfApi.model_info's `expand` values (hf_api.py:182-214, ExpandModelProperty_T).
EXPAND_MODEL = frozenset((
    "author", "baseModels", "cardData", "childrenModelCount", "config", "createdAt", "disabled", "downloads",
    "downloadsAllTime", "evalResults", "gated", "gguf", "inference", "inferenceProviderMapping",
    "lastModified", "library_name", "likes", "mask_token", "model-index", "pipeline_tag", "private",
    "resourceGroup", "safetensors", "sha", "siblings", "spaces", "tags", "transformersInfo", "trendingScore",
    "usedStorage", "widgetData"))


# ----------------------------------------------------------------------------- hashing and commits
def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_THRESHOLD


def git_blob_sha1(data: bytes) -> str:
    """Git's object id of a blob holding ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores for an LFS file: its blob is what the Hub lists as ``oid``."""
    return f"version {LFS_SPEC}\noid sha256:{sha256}\nsize {size}\n".encode()


def _hash_file(local: str, size: int, lfs: bool) -> str:
    """sha256 of the content for an LFS file, else the git blob sha1 of the content: one pass."""
    digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
    with open(local, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class _HashCache:
    """(path, size, mtime_ns) -> digest, in memory and in each repo folder's ``.hub-hashes.json``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folders: dict[str, dict[str, list]] = {}

    def _load(self, folder: str) -> dict[str, list]:
        if folder not in self._folders:
            try:
                with open(os.path.join(folder, HASH_CACHE), encoding="utf-8") as f:
                    data = json.load(f)
                files = data["files"] if data.get("version") == 1 else {}
            except (OSError, ValueError, KeyError, TypeError):
                files = {}
            self._folders[folder] = files if isinstance(files, dict) else {}
        return self._folders[folder]

    def digests(self, folder: str, stats: list[tuple[str, str, int, int]]) -> list[str]:
        """For each (path, local, size, mtime_ns): the digest, hashing only what changed."""
        with self._lock:
            cache = self._load(folder)
            out, changed = [], False
            for path, local, size, mtime_ns in stats:
                kind = "lfs" if _is_lfs(path, size) else "git"
                hit = cache.get(path)
                if isinstance(hit, list) and hit[:3] == [size, mtime_ns, kind]:
                    out.append(hit[3])
                    continue
                digest = _hash_file(local, size, kind == "lfs")
                cache[path] = [size, mtime_ns, kind, digest]
                out.append(digest)
                changed = True
            for gone in set(cache) - {s[0] for s in stats}:
                del cache[gone]
                changed = True
            if changed:
                self._save(folder, cache)
            return out

    @staticmethod
    def _save(folder: str, cache: dict[str, list]) -> None:
        target = os.path.join(folder, HASH_CACHE)
        tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"version": 1, "files": cache}, f, sort_keys=True)
            os.replace(tmp, target)
        except OSError:  # a read-only root: the in-memory cache still saves the work
            try:
                os.unlink(tmp)
            except OSError:
                pass


_HASHES = _HashCache()


@dataclass(frozen=True)
class RepoEntry:
    """One file of a repo, with what the Hub says about it."""

    path: str                 # repo-relative, "/"-separated
    local: str                # where its bytes are on this machine
    size: int
    mtime_ns: int
    blob: str                 # git blob sha1 of what git stores: the content, or the LFS pointer
    sha256: str | None        # LFS files only
    pointer_size: int | None  # LFS files only

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def etag(self) -> str:
        """The ETag the Hub gives: git sha1 for a regular file, sha256 for an LFS one (file_download.py:258-261)."""
        return self.sha256 or self.blob


@dataclass(frozen=True)
class Snapshot:
    """The files of ``org/name`` at its one commit."""

    repo_id: str
    folder: str
    commit: str
    files: tuple[RepoEntry, ...]      # sorted by path
    by_path: dict[str, RepoEntry]
    dirs: tuple[str, ...]             # every folder path, sorted
    tree_oids: dict[str, str]         # folder path ("" = root) -> git tree sha1
    last_modified: str
    created: str


def _walk(folder: str) -> list[tuple[str, str, int, int]]:
    """(path, local, size, mtime_ns) of every repo file under ``folder``, sorted by path."""
    found = []
    for top, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(HIDDEN_PREFIX))
        for name in filenames:
            if name.startswith(HIDDEN_PREFIX):
                continue
            local = os.path.join(top, name)
            try:
                st = os.stat(local)
            except OSError:
                continue
            if not os.path.isfile(local):
                continue
            path = os.path.relpath(local, folder).replace(os.sep, "/")
            found.append((path, local, st.st_size, st.st_mtime_ns))
    found.sort(key=lambda item: item[0])
    return found


def _digest_listing(listing: list[tuple[str, str]]) -> str:
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(listing))
    return hashlib.sha1(text.encode()).hexdigest()


def commit_of(folder: str | os.PathLike[str]) -> str:
    """The commit id of the repo held in ``folder``: 40 hex, sha1 over the sorted listing of (path, digest),
    digest being the sha256 of an LFS file and the git blob sha1 of any other. No times, no machine names:
    the same bytes under the same names give the same commit anywhere."""
    folder = os.fspath(folder)
    stats = _walk(folder)
    return _digest_listing(list(zip([s[0] for s in stats], _HASHES.digests(folder, stats))))


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + ".000Z"


def _tree_oids(files: tuple[RepoEntry, ...], dirs: tuple[str, ...]) -> dict[str, str]:
    """Git tree ids of every folder, the way git would build them (blobs 100644, trees 40000)."""
    children: dict[str, list[tuple[str, bool, str]]] = {d: [] for d in ("", *dirs)}
    for entry in files:
        parent, _, name = entry.path.rpartition("/")
        children[parent].append((name, False, entry.blob))
    oids: dict[str, str] = {}
    for d in sorted(children, key=lambda p: (p.count("/") + 1) if p else 0, reverse=True):
        items = sorted(children[d], key=lambda c: c[0].encode() + (b"/" if c[1] else b""))
        body = b"".join((b"40000 " if is_dir else b"100644 ") + name.encode() + b"\0" + bytes.fromhex(oid)
                        for name, is_dir, oid in items)
        oids[d] = hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()
        if d:
            parent, _, name = d.rpartition("/")
            children[parent].append((name, True, oids[d]))
    return oids


def scan(folder: str | os.PathLike[str], repo_id: str) -> Snapshot:
    """The snapshot of the repo held in ``folder`` (hashes from the cache where the file did not change)."""
    folder = os.fspath(folder)
    stats = _walk(folder)
    digests = _HASHES.digests(folder, stats)
    files = []
    for (path, local, size, mtime_ns), digest in zip(stats, digests):
        if _is_lfs(path, size):
            pointer = lfs_pointer(digest, size)
            files.append(RepoEntry(path, local, size, mtime_ns, git_blob_sha1(pointer), digest, len(pointer)))
        else:
            files.append(RepoEntry(path, local, size, mtime_ns, digest, None, None))
    dirs = sorted({"/".join(e.path.split("/")[:i]) for e in files for i in range(1, e.path.count("/") + 1)})
    times = [e.mtime_ns for e in files] or [0]
    entries = tuple(files)
    return Snapshot(repo_id=repo_id, folder=folder,
                    commit=_digest_listing([(e.path, e.etag) for e in entries]),
                    files=entries, by_path={e.path: e for e in entries}, dirs=tuple(dirs),
                    tree_oids=_tree_oids(entries, tuple(dirs)),
                    last_modified=_iso(max(times)), created=_iso(min(times)))


def _safetensors_parameters(local: str) -> dict[str, int]:
    """Element counts per dtype from a safetensors header (8-byte little-endian length, then JSON)."""
    counts: dict[str, int] = {}
    try:
        with open(local, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                return counts
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return counts
    for name, spec in header.items():
        if name == "__metadata__" or not isinstance(spec, dict):
            continue
        n = 1
        for dim in spec.get("shape", []):
            n *= int(dim)
        counts[spec.get("dtype", "?")] = counts.get(spec.get("dtype", "?"), 0) + n
    return counts


# ----------------------------------------------------------------------------- the server
class HubError(Exception):
    """An error answered the Hub's way: status, ``X-Error-Code``, ``X-Error-Message``, JSON ``{"error": ...}``
    (hf_raise_for_status reads the header code, utils/_http.py:803-804, and _format the header message and
    the body's "error", utils/_http.py:966-996)."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _repo_not_found() -> HubError:
    # A missing repo, as the Hub answers it to a caller it cannot tell allowed: 401, RepoNotFound
    # -> RepositoryNotFoundError (utils/_http.py:865-880). The code is needed here: the client's fallback on a
    # bare 401 (REPO_API_REGEX, utils/_http.py:173-187) only matches https:// endpoints.
    return HubError(401, "RepoNotFound", "Repository not found")


def _revision_not_found(rev: str) -> HubError:
    # -> RevisionNotFoundError (utils/_http.py:812-814); snapshot_download lets it through
    # (_snapshot_download.py:279-281), so does hf_hub_download (file_download.py:1781-1783).
    return HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")


def _entry_not_found(snap: Snapshot) -> HubError:
    # -> RemoteEntryNotFoundError (utils/_http.py:816-818); X-Repo-Commit lets the client cache the absence
    # (file_download.py:1723-1733).
    return HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snap.commit})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, hub: Hub, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self.hub = hub
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer is routine here (cuts, timeouts): say nothing unless verbose."""
        if self.hub.verbose or not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 with keep-alive: every answer carries a Content-Length (httpx reuses the connection).
    protocol_version = "HTTP/1.1"
    server_version = "gpunode-lab-hub/1"
    timeout = 600  # an idle keep-alive connection is dropped after this
    server: _Server

    # -- plumbing
    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.connections_lock:
                self.server.connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.hub.verbose:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        hub = self.server.hub
        self._status, self._sent, self._file, self._cut, self._started = 0, 0, None, False, False
        raw_path, _, query = self.path.partition("?")
        try:
            body = self._read_body()
            if raw_path.startswith("/_lab/"):
                self._lab(method, raw_path, body)
                return
            self._authorize(raw_path)
            self._route(method, raw_path, urllib.parse.parse_qs(query, keep_blank_values=True), body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # noqa: BLE001 - the server answers (500 if unforeseen) and keeps serving
            if self._started:  # the answer is under way: it can only be cut short
                self.close_connection = True
            else:
                self._error(err if isinstance(err, HubError)
                            else HubError(500, None, f"internal error: {type(err).__name__}: {err}"))
        finally:
            if not raw_path.startswith("/_lab/"):
                hub._record({"method": method, "path": self.path, "file": self._file,
                             "range": self.headers.get("Range"), "status": self._status,
                             "bytes_sent": self._sent, "cut": self._cut})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise HubError(411, None, "chunked request bodies are not supported: send a Content-Length")
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _base_url(self) -> str:
        return f"http://{self.headers.get('Host') or self.server.hub.netloc}"

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self._status, self._started = status, True
        self.send_response(status)
        self.send_header("X-Request-Id", f"Root={uuid.uuid4()}")
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
            self._sent = len(body)

    def _json(self, data: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._send(200, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body)

    def _error(self, err: HubError) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": _header_safe(err.message),
                   **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._send(err.status, headers, json.dumps({"error": err.message}).encode())

    # -- the token
    def _authorize(self, raw_path: str) -> None:
        """With a token set, a request without ``Authorization: Bearer <token>`` is answered as the Hub answers
        an anonymous caller of a gated repo: 401 GatedRepo -> GatedRepoError (utils/_http.py:820-824), a
        RepositoryNotFoundError subclass both download paths re-raise (_snapshot_download.py:365-369,
        file_download.py:1900-1905). A wrong token: 401 "Invalid credentials in Authorization header",
        which the client raises as an HfHubHTTPError with status 401 (utils/_http.py:865-868, 928). The
        token never appears in an answer. (The client sends ``authorization: Bearer`` from build_hf_headers and
        keeps it on a redirect to the same host, file_download.py:1769-1773, so ``/_lfs/`` is checked too.)"""
        token = self.server.hub.token
        if token is None:
            return
        given = self.headers.get("Authorization")
        if given is None:
            parts = raw_path.split("/")
            what = (f"model {urllib.parse.unquote(parts[3])}/{urllib.parse.unquote(parts[4])}"
                    if len(parts) > 4 and parts[1:3] == ["api", "models"]
                    else f"model {urllib.parse.unquote(parts[1])}/{urllib.parse.unquote(parts[2])}"
                    if len(parts) > 3 and parts[3] == "resolve" else "this resource")
            raise HubError(401, "GatedRepo", f"Access to {what} is restricted. You must have access to it and be "
                                             "authenticated to access it. Please log in.")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HubError(401, None, INVALID_CREDENTIALS)

    # -- routes
    def _route(self, method: str, raw_path: str, query: dict[str, list[str]], body: bytes) -> None:
        hub = self.server.hub
        parts = raw_path.split("/")[1:]
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            snap = hub._snapshot(parts[2], parts[3])
            rest = parts[4:]
            if not rest and method == "GET":
                return self._model_info(snap, BRANCH, query)
            if len(rest) == 2 and rest[0] == "revision" and method == "GET":
                return self._model_info(snap, urllib.parse.unquote(rest[1]), query)
            if len(rest) >= 2 and rest[0] == "tree" and method == "GET":
                return self._tree(snap, urllib.parse.unquote(rest[1]),
                                  urllib.parse.unquote("/".join(rest[2:])).strip("/"), query, raw_path)
            if len(rest) == 2 and rest[0] == "paths-info" and method == "POST":
                return self._paths_info(snap, urllib.parse.unquote(rest[1]), body)
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD") and parts[0] != "api":
            snap = hub._snapshot(parts[0], parts[1])
            return self._resolve(snap, urllib.parse.unquote(parts[3]), urllib.parse.unquote("/".join(parts[4:])))
        if len(parts) == 2 and parts[0] == "_lfs" and method in ("GET", "HEAD"):
            return self._lfs(parts[1])
        if len(parts) >= 2 and parts[0] == "api" and parts[1] in ("datasets", "spaces", "kernels", "buckets"):
            raise _repo_not_found()
        raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    @staticmethod
    def _check_revision(snap: Snapshot, rev: str) -> None:
        # `main` or the commit itself; the client quotes the revision with safe="" (hf_api.py:3322-3326,
        # 4095; file_download.py:280-282), so it arrives as one path segment.
        if rev not in (BRANCH, f"refs/heads/{BRANCH}", snap.commit):
            raise _revision_not_found(rev)

    def _model_info(self, snap: Snapshot, rev: str, query: dict[str, list[str]]) -> None:
        """GET /api/models/{repo}[/revision/{rev}] (hf_api.py:3322-3337): ModelInfo(**json) (hf_api.py:1030-1127)
        needs only ``id``; snapshot_download reads ``sha`` (_snapshot_download.py:268-270). ``blobs=True``
        (files_metadata, hf_api.py:3330) adds size/blobId/lfs to each sibling (hf_api.py:1084-1103);
        ``expand=`` (hf_api.py:3332) keeps only the named properties, as the Hub does."""
        self._check_revision(snap, rev)
        hub = self.server.hub
        blobs = _truthy(query.get("blobs"))
        siblings = []
        for e in snap.files:
            sibling: dict[str, Any] = {"rfilename": e.path}
            if blobs:
                sibling.update(size=e.size, blobId=e.blob)
                if e.lfs:
                    sibling["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": e.pointer_size}
            siblings.append(sibling)
        config = _read_json(os.path.join(snap.folder, "config.json"))
        org = snap.repo_id.split("/")[0]
        info: dict[str, Any] = {
            "_id": hashlib.sha1(snap.repo_id.encode()).hexdigest()[:24], "id": snap.repo_id,
            "modelId": snap.repo_id, "author": org, "sha": snap.commit, "lastModified": snap.last_modified,
            "createdAt": snap.created, "private": False, "gated": "manual" if hub.token else False,
            "disabled": False, "downloads": 0, "downloadsAllTime": 0, "likes": 0, "trendingScore": 0,
            "tags": [], "siblings": siblings, "spaces": [], "usedStorage": sum(e.size for e in snap.files),
        }
        if isinstance(config, dict):
            keep = {k: config[k] for k in ("architectures", "model_type") if k in config}
            quant = config.get("quantization_config")
            if isinstance(quant, dict) and "quant_method" in quant:
                keep["quantization_config"] = {"quant_method": quant["quant_method"]}
            info["config"] = keep
            info["library_name"] = "transformers"
            info["tags"] = ["transformers", *([config["model_type"]] if "model_type" in config else [])]
            if any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
                info["pipeline_tag"] = "text-generation"
                info["transformersInfo"] = {"auto_model": "AutoModelForCausalLM",
                                            "pipeline_tag": "text-generation", "processor": "AutoTokenizer"}
        params: dict[str, int] = {}
        for e in snap.files:
            if e.path.endswith(".safetensors"):
                for dtype, n in hub._parameters(e).items():
                    params[dtype] = params.get(dtype, 0) + n
        if params:
            info["safetensors"] = {"parameters": params, "total": sum(params.values())}
            info["tags"].append("safetensors")
        if _truthy(query.get("securityStatus")):
            info["securityRepoStatus"] = {"scansDone": True, "filesWithIssues": []}
        expand = [v for values in query.get("expand", []) for v in values.split(",") if v]
        if expand:
            unknown = sorted(set(expand) - EXPAND_MODEL)
            if unknown:
                raise HubError(400, None, f"Invalid expand value(s): {', '.join(unknown)}")
            info = {k: v for k, v in info.items() if k in ("_id", "id") or k in expand}
        self._json(info)

    def _entry_json(self, snap: Snapshot, path: str, expand: bool) -> dict[str, Any]:
        """A /tree or /paths-info item as RepoFile/RepoFolder read it (hf_api.py:828-857, 878-887)."""
        entry = snap.by_path.get(path)
        if entry is not None:
            item: dict[str, Any] = {"type": "file", "oid": entry.blob, "size": entry.size, "path": path}
            if entry.lfs:
                item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
        else:
            item = {"type": "directory", "oid": snap.tree_oids[path], "size": 0, "path": path}
        if expand:
            item["lastCommit"] = {"id": snap.commit, "title": "Upload folder using huggingface_hub",
                                  "date": snap.last_modified}
            if entry is not None:
                item["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None},
                                              "pickleImportScan": None}
        return item

    def _tree(self, snap: Snapshot, rev: str, path: str, query: dict[str, list[str]], raw_path: str) -> None:
        """GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand= (hf_api.py:4094-4101), paged the way
        paginate follows it: the JSON list of one page, and ``Link: <absolute url>; rel="next"`` while more
        remain (utils/_pagination.py:35-52; httpx parses ``response.links``). The client's own snapshot
        listing is recursive, unexpanded, at the commit (_snapshot_download.py:384-396)."""
        self._check_revision(snap, rev)
        recursive, expand = _truthy(query.get("recursive")), _truthy(query.get("expand"))
        if path and path not in snap.tree_oids:
            raise _entry_not_found(snap)
        prefix = f"{path}/" if path else ""
        names = [p for p in (*snap.dirs, *snap.by_path) if p.startswith(prefix) and p != path]
        if not recursive:
            names = [p for p in names if "/" not in p[len(prefix):]]
        names.sort()
        start = 0
        if query.get("cursor"):
            start = _decode_cursor(query["cursor"][0], snap.commit)
        size = self.server.hub.page_size
        page = [self._entry_json(snap, p, expand) for p in names[start:start + size]]
        headers = {}
        if start + size < len(names):
            params = {k: v for k, v in query.items() if k != "cursor"}
            params["cursor"] = [_encode_cursor(start + size, snap.commit)]
            headers["Link"] = f'<{self._base_url()}{raw_path}?{urllib.parse.urlencode(params, doseq=True)}>; rel="next"'
        self._json(page, headers)

    def _paths_info(self, snap: Snapshot, rev: str, body: bytes) -> None:
        """POST /api/models/{repo}/paths-info/{rev}, form ``paths=..&paths=..&expand=`` (hf_api.py:4397-4415):
        the items of the paths that exist, the others left out (as get_paths_info documents)."""
        self._check_revision(snap, rev)
        if body.lstrip().startswith(b"{"):
            data = json.loads(body)
            paths, expand = data.get("paths", []), bool(data.get("expand"))
        else:
            form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), _truthy(form.get("expand"))
        wanted = [p.strip("/") for p in paths]
        out = [self._entry_json(snap, p, expand) for p in wanted if p in snap.by_path or (p and p in snap.tree_oids)]
        self._json(out)

    def _resolve(self, snap: Snapshot, rev: str, path: str) -> None:
        """HEAD/GET /{repo}/resolve/{rev}/{path} (URL built at file_download.py:280-287).

        The client's HEAD (get_hf_file_metadata, file_download.py:1612-1641) does not follow a redirect to
        another host (utils/_http.py:721-740) and needs, or fails with FileMetadataError
        (file_download.py:1739-1759): ``X-Repo-Commit``; ``X-Linked-Etag`` or ``ETag``; ``X-Linked-Size`` or,
        when not redirected, ``Content-Length``. A regular file: 200, ETag = git sha1, the bytes on GET. An LFS
        file: 302 to ``/_lfs/{sha256}`` by absolute URL (the Hub's CDN redirect), with ``X-Linked-Etag`` =
        sha256 and ``X-Linked-Size``; the client then GETs that Location itself (file_download.py:1769-1773)."""
        self._check_revision(snap, rev)
        entry = snap.by_path.get(path)
        if entry is None:
            raise _entry_not_found(snap)
        self._file = entry.path
        common = {"X-Repo-Commit": snap.commit, "Vary": "Origin, Accept"}
        if entry.lfs:
            self._send(302, {**common, "Location": f"{self._base_url()}/_lfs/{entry.sha256}",
                             "X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size),
                             "ETag": f'"{entry.sha256}"', "Content-Type": "text/plain; charset=utf-8"})
            return
        self._send_file(entry, {**common, "ETag": f'"{entry.blob}"'})

    def _lfs(self, sha256: str) -> None:
        """GET/HEAD /_lfs/{sha256}: the LFS bytes, as the CDN behind the Hub's redirect serves them."""
        entry = self.server.hub._blob(sha256)
        if entry is None:
            raise HubError(404, None, "Not Found")
        self._send_file(entry, {"ETag": f'"{entry.sha256}"'})

    def _send_file(self, entry: RepoEntry, headers: dict[str, str]) -> None:
        """200 with the whole file, or 206 for ``Range: bytes=N-`` (and N-M, -K): the header http_get sends to
        resume (file_download.py:366-368, utils/_http.py:1131-1165); the client reads the total back from
        ``Content-Range`` or ``Content-Length`` (file_download.py:289-322). ``Accept-Encoding: identity`` is all
        the client asks (file_download.py:1618): nothing is compressed. ``Content-Disposition`` ends in ``;``
        for the client's filename pattern (file_download.py:69, 409-414)."""
        self._file = entry.path
        size = entry.size
        name = entry.path.rsplit("/", 1)[-1]
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "Content-Disposition": f"inline; filename*=UTF-8''{urllib.parse.quote(name)}; "
                                          f'filename="{_header_safe(name).replace(chr(34), "?")}";'}
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted:
            span = _parse_range(wanted, size)
            if span == "unsatisfiable":
                raise HubError(416, None, "Requested Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
            if span is not None:
                start, end = span
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        headers["Content-Length"] = str(end - start)
        count = end - start
        hub = self.server.hub
        cut = hub._take_fault(hub._cuts, entry) if self.command == "GET" else None
        stall = hub._take_fault(hub._stalls, entry) if self.command == "GET" else None
        with open(entry.local, "rb") as f:
            self._send(status, headers)
            if self.command == "HEAD":
                return
            if cut is not None and cut < count:
                count, self._cut = cut, True
            if stall is not None and stall < count:
                # N bytes, then nothing until the client goes (a killed download) or the lab lets go
                f.seek(start)
                self.connection.sendall(f.read(stall))
                self._sent = stall
                hub._unstall.wait()
                self._cut, self.close_connection = True, True
                return
            # 1 MiB reads and sendall: on the loopback this measured ~1.8 GiB/s against socket.sendfile's
            # ~1.5 and http.server's ~1.6 (curl to /dev/null, 2 GiB file, page-cached)
            f.seek(start)
            buf = memoryview(bytearray(SEND_CHUNK))
            sent = 0
            while sent < count:
                n = f.readinto(buf[:min(SEND_CHUNK, count - sent)])
                if not n:
                    break
                self.connection.sendall(buf[:n])
                sent += n
                self._sent = sent
        if sent < count and not self._cut:  # the file shrank under us: the promised length cannot be kept
            self.close_connection = True
        if self._cut:
            # A FIN before the promised Content-Length: httpx raises RemoteProtocolError, which http_get retries
            # with a Range (file_download.py:448-470). (An RST would be a ReadError, which it does not retry.)
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- lab controls
    def _lab(self, method: str, raw_path: str, body: bytes) -> None:
        hub = self.server.hub
        if raw_path == "/_lab/log" and method == "GET":
            return self._json(hub.log())
        if raw_path == "/_lab/log" and method == "DELETE":
            hub.clear_log()
            return self._json({"cleared": True})
        if raw_path == "/_lab/faults" and method in ("GET", "POST"):
            if method == "POST":
                try:
                    hub.faults(json.loads(body or b"{}"))
                except (ValueError, TypeError, KeyError) as err:
                    raise HubError(400, None, f"bad faults: {err}") from None
            return self._json(hub.fault_state())
        raise HubError(404, None, "no such lab control")


def _header_safe(text: str) -> str:
    """Printable ASCII only: no header splitting by a CR/LF smuggled in through a %-escape."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("1", "true", "yes", "on")


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _encode_cursor(offset: int, commit: str) -> str:
    return base64.urlsafe_b64encode(f"{offset}:{commit}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, commit: str) -> int:
    try:
        offset, _, at = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition(":")
        if at != commit:
            raise ValueError("the repo changed since the first page")
        return int(offset)
    except (ValueError, UnicodeDecodeError) as err:
        raise HubError(400, None, f"Invalid cursor: {err}") from None


def _parse_range(value: str, size: int) -> tuple[int, int] | str | None:
    """(start, end) of a single ``bytes=`` range, "unsatisfiable", or None to answer with the whole file."""
    unit, _, spec = value.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if not first:
            n = int(last)
            return (max(0, size - n), size) if n > 0 and size > 0 else "unsatisfiable"
        start = int(first)
        end = min(size, int(last) + 1) if last else size
    except ValueError:
        return None
    if start >= size or start >= end:
        return "unsatisfiable"
    return start, end


class Hub:
    """The stand-in, in a background thread: ``with Hub(root).start() as hub: ... hub.url ...``."""

    def __init__(self, root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, page_size: int = DEFAULT_PAGE_SIZE, verbose: bool = False) -> None:
        check_loopback(host)
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.root = os.path.abspath(os.fspath(root))
        self.host, self.port, self.token, self.page_size, self.verbose = host, port, token, page_size, verbose
        self._log: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._cuts: dict[str, int] = {}
        self._stalls: dict[str, int] = {}
        self._unstall = threading.Event()
        self._blobs: dict[str, RepoEntry] = {}
        self._params: dict[tuple[str, int, int], dict[str, int]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle
    def start(self, prehash: bool = True) -> Hub:
        """Bind, hash every repo once (``prehash``: so a first HEAD is not held up by hashing), serve."""
        if prehash:
            self.scan_all()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._server = _Server(self, (self.host, self.port), family)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"hub:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop the kept-alive connections."""
        server, self._server = self._server, None
        if server is None:
            return
        self._unstall.set()
        server.shutdown()
        with server.connections_lock:
            for conn in list(server.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Hub:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The endpoint to give the client (``endpoint=`` or ``HF_ENDPOINT``)."""
        return f"http://{self.netloc}"

    # -- the lab's view
    def log(self) -> list[dict[str, Any]]:
        """Every request served but the /_lab/ ones: method, path (as sent, with its query), file (the repo
        path a resolve or /_lfs/ request was about, else None), range (the Range header), status, bytes_sent (body
        bytes), cut (the connection was cut by a fault)."""
        with self._lock:
            return [dict(item) for item in self._log]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def faults(self, spec: dict[str, Any]) -> None:
        """``{"cut": {"path": P, "after": N}}``: the next GET body of file P (a repo path, or its tail after a
        "/"; of any repo) sends N bytes, then the connection closes, once. ``{"token": "..."}`` / ``{"token":
        null}``: require that token from now on / no longer. ``{"stall": {"path": P, "after": N}}``: the next GET
        body of P sends N bytes, then holds the connection open, silent, until the client goes or the stall is
        cleared (a download killed mid-file). ``{"clear": true}``: drop pending cuts and stalls and let held
        connections go (the token stays as set). Keys combine; clear runs first."""
        if not isinstance(spec, dict):
            raise TypeError("a JSON object")
        with self._lock:
            if spec.get("clear"):
                self._cuts.clear()
                self._stalls.clear()
                self._unstall.set()
            for key, pending in (("cut", self._cuts), ("stall", self._stalls)):
                if key not in spec:
                    continue
                items = spec[key] if isinstance(spec[key], list) else [spec[key]]
                for item in items:
                    after = int(item["after"])
                    if after < 0:
                        raise ValueError("after must be >= 0")
                    pending[str(item["path"]).strip("/")] = after
                if key == "stall":
                    self._unstall.clear()
            if "token" in spec:
                token = spec["token"]
                if token is not None and (not isinstance(token, str) or not token):
                    raise ValueError("token must be a non-empty string or null")
                self.token = token

    def fault_state(self) -> dict[str, Any]:
        with self._lock:
            return {"cuts": [{"path": p, "after": n} for p, n in sorted(self._cuts.items())],
                    "stalls": [{"path": p, "after": n} for p, n in sorted(self._stalls.items())],
                    "token": self.token is not None}

    def _take_fault(self, pending: dict[str, int], entry: RepoEntry) -> int | None:
        with self._lock:
            for key in list(pending):
                if entry.path == key or entry.path.endswith("/" + key):
                    return pending.pop(key)
        return None

    def _record(self, item: dict[str, Any]) -> None:
        with self._lock:
            self._log.append(item)

    # -- repos
    def _snapshot(self, org_raw: str, name_raw: str) -> Snapshot:
        org, name = urllib.parse.unquote(org_raw), urllib.parse.unquote(name_raw)
        for part in (org, name):
            if not part or part.startswith(".") or "/" in part or "\\" in part or "\0" in part:
                raise _repo_not_found()
        folder = os.path.join(self.root, org, name)
        if not os.path.isdir(folder):
            raise _repo_not_found()
        with self._scan_lock:
            snap = scan(folder, f"{org}/{name}")
            for entry in snap.files:
                if entry.lfs:
                    self._blobs[entry.sha256] = entry
        return snap

    def scan_all(self) -> dict[str, str]:
        """Hash every repo under the root: {repo_id: commit}."""
        commits = {}
        for org in sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []:
            if org.startswith(".") or not os.path.isdir(os.path.join(self.root, org)):
                continue
            for name in sorted(os.listdir(os.path.join(self.root, org))):
                if not name.startswith(".") and os.path.isdir(os.path.join(self.root, org, name)):
                    commits[f"{org}/{name}"] = self._snapshot(org, name).commit
        return commits

    def _blob(self, sha256: str) -> RepoEntry | None:
        entry = self._blobs.get(sha256)
        if entry is not None:
            try:
                st = os.stat(entry.local)
                if (st.st_size, st.st_mtime_ns) == (entry.size, entry.mtime_ns):
                    return entry
            except OSError:
                pass
        self.scan_all()
        return self._blobs.get(sha256)

    def _parameters(self, entry: RepoEntry) -> dict[str, int]:
        key = (entry.local, entry.size, entry.mtime_ns)
        if key not in self._params:
            self._params[key] = _safetensors_parameters(entry.local)
        return self._params[key]


def check_loopback(host: str) -> None:
    """Refuse to listen anywhere but on the loopback: this is a lab fixture with no TLS and a toy token."""
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"refusing to listen on {host!r}: the hub stand-in serves the loopback only "
                         "(127.0.0.1, ::1 or localhost)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hub.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="folder of <org>/<name>/ repos")
    parser.add_argument("--port", required=True, type=int, help="TCP port (0: any free one, printed)")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    parser.add_argument("--token-file", help="require 'Authorization: Bearer <the file's content>'")
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="items per /tree page")
    parser.add_argument("--verbose", action="store_true", help="an access log on stderr")
    args = parser.parse_args(argv)
    try:
        check_loopback(args.host)
    except ValueError as err:
        parser.error(str(err))
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root}: not a folder")
    token = None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as err:
            parser.error(f"--token-file: {err}")
        if not token:
            parser.error("--token-file: the file is empty")
    hub = Hub(args.root, host=args.host, port=args.port, token=token, page_size=args.page_size,
              verbose=args.verbose)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    hub.start()
    commits = hub.scan_all()
    print(json.dumps({"url": hub.url, "root": hub.root, "repos": commits}), flush=True)
    stopping.wait()
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
