"""Fetch exactly the pinned revision into the store with huggingface_hub, and prove it whole.

One ``converge`` per run: the manifest kept beside the weights says what the revision holds (read
from the Hub's tree listing once, so that a converged node needs no network at all); the files
that are missing, short or not the revision's are fetched again, after a disk preflight against the
store's free space; then everything is verified.

A file fetched over plain HTTP goes through huggingface_hub's own ``http_get`` into a partial file of
ours, named by the hash the revision lists and hashed as it is written, so that a run killed mid-file
goes on from the partial's size with a ``Range`` request and the file is proven as it lands.
huggingface_hub (since 1.11, PR #4228; issue #4196 is open) downloads into a per-process temporary file
and deletes it on failure, so its own downloads start a killed file over. A file the endpoint offers
through Xet (a ``X-Xet-Hash`` on the HEAD) goes through ``hf_hub_download`` and hf_xet.

Runs with the model tools on the machine that holds the weights (``python -m gpunode.stages.model``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpunode.stages.model import manifest as manifests
from gpunode.stages.model.manifest import FileEntry, Stamp
from gpunode.stages.model.verify import Report, verify

PROBE_TIMEOUT_S = 10.0  # the Hub's first answer; an unreachable one fails inside 15 s
PROGRESS_EVERY_S = 1.0
HF_META = Path(".cache") / "huggingface" / "download"  # huggingface_hub's local_dir metadata (_local_folder.py)
PARTIAL = Path(".cache") / "gpunode" / "partial"  # our unfinished files, <hash>.part, kept across runs
HASH_CHUNK = 8 << 20
# What http_get hands the writer at a time (its constants.DOWNLOAD_CHUNK_SIZE, read at each call,
# file_download.py:439). Its 10 MiB chunks are rebuilt by httpx's ByteChunker through a BytesIO, copied
# three times outside the CPU's cache with the GIL held: measured on a 16-core machine, http_get alone
# ran at 0.60 of a plain httpx client with 10 MiB and 0.90 with 1 MiB (benchmarks/model_fetch.py).
READ_CHUNK = 1 << 20


class HubUnreachable(Exception):
    """The endpoint did not answer."""


class HubRefused(Exception):
    """The endpoint answered no: repo or revision not found, token refused."""


class StoreTooSmall(Exception):
    """The store cannot hold what must be fetched."""


@dataclass(frozen=True)
class Plan:
    repo: str
    revision: str | None  # hub only
    endpoint: str | None
    weights_dir: Path
    manifest: Path | None
    verify: str
    workers: int
    architecture: str | None
    quantization: dict[str, str]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Plan:
        return cls(repo=data["repo"], revision=data.get("revision"), endpoint=data.get("endpoint"),
                   weights_dir=Path(data["weights_dir"]),
                   manifest=Path(data["manifest"]) if data.get("manifest") else None, verify=data["verify"],
                   workers=int(data["workers"]), architecture=data.get("architecture"),
                   quantization=dict(data.get("quantization") or {}))


def _hub_error(exc: BaseException, token: str | None) -> Exception:
    """The client's exception as ours, its text without the token."""
    import httpx
    from huggingface_hub import errors

    text = " ".join(str(exc).split())
    if token:
        text = text.replace(token, "***")
    text = text[:300]
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubRefused(f"revision not found on the Hub: {text}")
    if isinstance(exc, errors.GatedRepoError):
        return HubRefused(f"the Hub refused the token for a gated repo (set model.token to one with access): {text}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubRefused(f"repo not found, or the token was refused (a private repo answers the same): {text}")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return HubRefused(f"the Hub refused the token (HTTP {status}): {text}")
        return HubRefused(f"the Hub answered HTTP {status}: {text}")
    if isinstance(exc, (httpx.TransportError, OSError, errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
        return HubUnreachable(f"{type(exc).__name__}: {text}")
    return exc if isinstance(exc, Exception) else RuntimeError(text)


def probe(plan: Plan, token: str | None) -> Any:
    """The revision endpoint, answered within PROBE_TIMEOUT_S: whether the Hub is there, the repo and
    revision exist and the token is taken. Returns the client, for the listing."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=plan.endpoint, token=token or False)
    try:
        api.model_info(plan.repo, revision=plan.revision, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:
        raise _hub_error(exc, token) from None
    return api


def remote_manifest(plan: Plan, token: str | None) -> manifests.Manifest:
    """The revision's files from the Hub's tree listing, after the probe."""
    from huggingface_hub.hf_api import RepoFile

    api = probe(plan, token)
    try:
        items = [{"path": f.path, "size": f.size, "blob_id": f.blob_id,
                  "lfs": {"size": f.lfs.size, "sha256": f.lfs.sha256} if f.lfs else None}
                 for f in api.list_repo_tree(plan.repo, revision=plan.revision, recursive=True, expand=False)
                 if isinstance(f, RepoFile)]
    except Exception as exc:
        raise _hub_error(exc, token) from None
    try:
        return manifests.from_tree(plan.repo, plan.revision, items)
    except manifests.ManifestError as exc:  # a path or hash no Hub lists: nothing of it is written
        raise HubRefused(f"the Hub's listing of {plan.revision}: {exc}") from None


def partial_path(folder: Path, entry: FileEntry) -> Path:
    """Where a file's unfinished bytes wait: named by the hash the revision lists for it, so that a
    partial is only ever resumed into the very content it was begun for."""
    return folder / PARTIAL / f"{entry.listed_hash}.part"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _partial_bytes(folder: Path, entries: list[FileEntry]) -> int:
    """Bytes already fetched of these files and kept (resumed, not fetched again), at most each size."""
    return sum(min(_size(partial_path(folder, entry)), entry.size) for entry in entries)


def _in_flight_bytes(folder: Path) -> int:
    """Bytes in huggingface_hub's own unfinished downloads (the Xet path's)."""
    meta = folder / HF_META
    return sum(_size(p) for p in meta.rglob("*.incomplete")) if meta.is_dir() else 0


def preflight(plan: Plan, man: manifests.Manifest, paths: list[str]) -> tuple[int, int]:
    """(bytes still to fetch, bytes free in the store); raises StoreTooSmall naming both."""
    wanted = set(paths)
    entries = [entry for entry in man.files if entry.path in wanted]
    need = max(0, sum(entry.size for entry in entries) - _partial_bytes(plan.weights_dir, entries))
    where = plan.weights_dir
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise StoreTooSmall(f"the store {where} has {_gb(free)} free and the revision needs {_gb(need)} more "
                            f"({_gb(man.total_bytes)} in all): refused before the first byte")
    return need, free


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB ({n} bytes)"


def _forget(plan: Plan, man: manifests.Manifest, path: str) -> None:
    """Drop a bad file, its stamp and its local metadata, so that the fetch takes it from the Hub again."""
    man.stamps.pop(path, None)
    (plan.weights_dir / path).unlink(missing_ok=True)
    (plan.weights_dir / HF_META / f"{path}.metadata").unlink(missing_ok=True)


def _on_disk(folder: Path, entries: list[FileEntry]) -> int:
    return sum(_size(folder / entry.path) for entry in entries) + _partial_bytes(folder, entries) \
        + _in_flight_bytes(folder)


@contextmanager
def progress(plan: Plan, entries: list[FileEntry], total: int, emit: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """A progress line each second (bytes, rate, ETA), read from the disk: what has been written of
    the files being fetched, finished or not."""
    stop = threading.Event()
    start, base = time.monotonic(), _on_disk(plan.weights_dir, entries)

    def tick() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            done = _on_disk(plan.weights_dir, entries)
            rate = (done - base) / max(time.monotonic() - start, 1e-6)
            emit({"progress": {"bytes": done, "total": total, "rate": round(rate),
                               "eta_s": round((total - done) / rate) if rate > 0 else None}})

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class _HashingWriter:
    """The partial file as ``http_get`` writes it: each byte hashed as it is written, on a thread of its
    own, so that receiving the next chunk and hashing and writing this one overlap (inline, a download
    runs at the harmonic sum of the two). ``http_get`` seeks to 0 and truncates when a server answers a
    Range with the whole file, and asks ``tell`` at the end: both wait for what is queued first."""

    QUEUED = 16  # chunks in flight per file (READ_CHUNK each)
    # Every WRITEBACK_EVERY bytes the kernel is told to write out what came since the last time and to
    # drop what is already on the disk (posix_fadvise DONTNEED: writeback starts, nothing waits). The
    # disk's writeback overlaps the receive, a 450 GB checkpoint never fills the page cache (what the
    # host had cached stays), and the fsync before the move has little left to do. A fdatasync instead
    # stalled the file's writes for every flush: 0.54 of a plain client against 1.19 (16 cores, 2 files).
    WRITEBACK_EVERY = 64 << 20

    def __init__(self, handle: Any, entry: FileEntry) -> None:
        self.handle, self.entry = handle, entry
        self.digest = self._fresh()
        handle.seek(0)
        while chunk := handle.read(HASH_CHUNK):  # the bytes kept from an earlier run, read once
            self.digest.update(chunk)
        # [_dropped, _written_back): out to the disk since the last call, dropped by the next one
        self._end = self._written_back = self._dropped = handle.tell()
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.QUEUED)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name=f"hash:{entry.path}", daemon=True)
        self._thread.start()

    def _fresh(self) -> Any:
        if self.entry.sha256:
            return hashlib.sha256()
        return hashlib.sha1(f"blob {self.entry.size}\0".encode())  # the git blob id the Hub lists

    def _drain(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                if self._failed is None:
                    self.handle.write(data)
                    self.digest.update(data)
                    self._end += len(data)
                    if self._end - self._written_back >= self.WRITEBACK_EVERY:
                        self._write_back()
            except BaseException as exc:  # kept for the receiving thread, which raises it
                self._failed = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _write_back(self) -> None:
        self.handle.flush()
        os.posix_fadvise(self.handle.fileno(), self._dropped, self._end - self._dropped, os.POSIX_FADV_DONTNEED)
        self._dropped, self._written_back = self._written_back, self._end

    def _settle(self) -> None:
        self._queue.join()
        if self._failed is not None:
            raise self._failed

    def write(self, data: bytes) -> int:
        if self._failed is not None:
            raise self._failed
        self._queue.put(bytes(data))
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise OSError("only a restart from 0 is expected of http_get")
        self._settle()
        self.digest = self._fresh()
        self._end = self._written_back = self._dropped = 0
        return self.handle.seek(0)

    def truncate(self, size: int | None = None) -> int:
        self._settle()
        return self.handle.truncate(size)

    def tell(self) -> int:
        self._settle()
        return self.handle.tell()

    def close(self) -> None:
        """Let the thread go; what was queued is written first."""
        self._queue.put(None)
        self._thread.join()
        if self._failed is not None:
            raise self._failed

    def hexdigest(self) -> str:
        self._settle()
        return self.digest.hexdigest()


def _fetch_file(plan: Plan, entry: FileEntry, token: str | None) -> Stamp | None:
    """One file of the pinned revision into place; its stamp when it was hashed as it was written."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get, is_xet_available
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(plan.repo, entry.path, revision=plan.revision, endpoint=plan.endpoint)
    meta = get_hf_file_metadata(url, token=token or False, timeout=PROBE_TIMEOUT_S, endpoint=plan.endpoint)
    if meta.commit_hash is not None and meta.commit_hash != plan.revision:
        raise HubRefused(f"the Hub answered {entry.path} from commit {meta.commit_hash}, not the pinned {plan.revision}")
    if meta.xet_file_data is not None and is_xet_available():
        hf_hub_download(plan.repo, entry.path, revision=plan.revision, local_dir=plan.weights_dir,
                        endpoint=plan.endpoint, token=token or False, etag_timeout=PROBE_TIMEOUT_S)
        return None  # verify hashes it
    headers = build_hf_headers(token=token or False)
    if urlparse(meta.location).netloc != urlparse(url).netloc:
        headers.pop("authorization", None)  # a CDN's signed URL takes no token (as hf_hub_download does)
    part = partial_path(plan.weights_dir, entry)
    part.parent.mkdir(parents=True, exist_ok=True)
    with open(part, "a+b") as handle:  # appends: every write lands at the end, whatever was read
        resume = handle.seek(0, os.SEEK_END)
        if resume > entry.size:  # longer than the file can be: not ours to resume
            handle.truncate(0)
            resume = handle.seek(0)
        writer = _HashingWriter(handle, entry)
        try:
            http_get(meta.location, writer, resume_size=resume, headers=headers,  # type: ignore[arg-type]
                     expected_size=entry.size, displayed_filename=entry.path)
        finally:
            writer.close()  # what arrived is on its way to the disk, kill or not
        handle.flush()
        os.fsync(handle.fileno())
    got, want = writer.hexdigest(), entry.listed_hash
    if got != want:
        part.unlink(missing_ok=True)
        raise HubRefused(f"{entry.path} came with hash {got}, not the revision's {want}: dropped, "
                         "the next provision fetches it again")
    target = plan.weights_dir / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(part, 0o644)
    os.replace(part, target)
    return Stamp.of(os.stat(target))


def download(plan: Plan, entries: list[FileEntry], token: str | None) -> dict[str, Stamp]:
    """Exactly these files of the pinned revision into the weights folder, ``workers`` at a time, the
    largest first; the stamps of those hashed as they were written."""
    from huggingface_hub import constants

    stamps: dict[str, Stamp] = {}
    chunk, constants.DOWNLOAD_CHUNK_SIZE = constants.DOWNLOAD_CHUNK_SIZE, READ_CHUNK
    try:
        return _download(plan, entries, token, stamps)
    finally:
        constants.DOWNLOAD_CHUNK_SIZE = chunk  # the process's other callers keep the library's own


def _download(plan: Plan, entries: list[FileEntry], token: str | None, stamps: dict[str, Stamp]) -> dict[str, Stamp]:
    with ThreadPoolExecutor(max_workers=max(1, plan.workers), thread_name_prefix="fetch") as pool:
        futures = {pool.submit(_fetch_file, plan, entry, token): entry
                   for entry in sorted(entries, key=lambda e: (-e.size, e.path))}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done | pending:
            if future.cancelled():
                continue
            try:
                stamp = future.result()
            except Exception as exc:
                raise _hub_error(exc, token) from None
            if stamp is not None:
                stamps[futures[future].path] = stamp
    return stamps


def _drop_stale(plan: Plan, man: manifests.Manifest) -> None:
    """What no run can reuse: huggingface_hub's per-process ``*.incomplete`` files of a killed run, and
    partials of ours whose hash the revision no longer needs."""
    meta = plan.weights_dir / HF_META
    if meta.is_dir():
        for stale in meta.rglob("*.incomplete"):
            stale.unlink(missing_ok=True)
    folder = plan.weights_dir / PARTIAL
    if folder.is_dir():
        keep = {partial_path(plan.weights_dir, entry).name for entry in man.files}
        for stale in folder.iterdir():
            if stale.name not in keep:
                stale.unlink(missing_ok=True)


@contextmanager
def locked(plan: Plan) -> Iterator[None]:
    """One fetch of a revision at a time (two provisions of one host, say)."""
    assert plan.manifest is not None
    plan.manifest.parent.mkdir(parents=True, exist_ok=True)
    with open(plan.manifest.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check(plan: Plan, man: manifests.Manifest | None, level: str, source: str = "hub") -> Report:
    return verify(plan.weights_dir, manifest=man, level=level, workers=plan.workers, source=source,
                  architecture=plan.architecture, quantization=plan.quantization)


def converge(plan: Plan, token: str | None, check_mode: bool, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Verify; fetch what is not the revision's; verify again. A converged folder needs no network."""
    start = time.monotonic()
    with locked(plan):
        assert plan.manifest is not None and plan.revision is not None  # source: hub
        man = manifests.load(plan.manifest, plan.repo, plan.revision)
        listed = man is None
        kept = dict(man.stamps) if man is not None else {}
        if man is None:
            man = remote_manifest(plan, token)
        report = check(plan, man, plan.verify)
        fetch = report.bad_files
        out: dict[str, Any] = {"changed": False, "listed": listed, "fetched": [], "fetched_bytes": 0,
                               "total_bytes": man.total_bytes, "files": len(man.files)}
        if check_mode:
            return {**out, "would_fetch": fetch, "verify": report.as_dict(), "seconds": round(time.monotonic() - start, 3)}
        plan.weights_dir.mkdir(parents=True, exist_ok=True)
        if listed:
            manifests.save(plan.manifest, man)
        if fetch:
            if not listed:
                probe(plan, token)  # the Hub answers (and takes the token) before anything is dropped
            _drop_stale(plan, man)
            need, _free = preflight(plan, man, fetch)
            for path in fetch:
                _forget(plan, man, path)
            fetching = set(fetch)
            entries = [entry for entry in man.files if entry.path in fetching]
            total = sum(entry.size for entry in entries)
            emit({"fetching": {"files": len(fetch), "bytes": total, "to_fetch": need}})
            with progress(plan, entries, total, emit):
                streamed = download(plan, entries, token)
            out.update(changed=True, fetched=fetch, fetched_bytes=need, hashed_while_fetched=len(streamed))
            man.stamps = {**man.stamps, **streamed}
        man.stamps = {**man.stamps, **report.stamps}
        if fetch:
            # What was not hashed as it came (the Xet path's) is hashed now: nothing proves it yet.
            report = check(plan, man, "sizes")
        man.stamps = {**man.stamps, **report.stamps}
        if man.stamps != kept or listed or fetch:
            manifests.save(plan.manifest, man)  # the hashes done, so that the next run need not repeat them
        return {**out, "verify": report.as_dict(), "seconds": round(time.monotonic() - start, 3)}


def offline(plan: Plan, source: str, level: str | None = None) -> dict[str, Any]:
    """Verify only (gpunode check): no network, the manifest as kept; nothing written."""
    man = None
    if source == "hub":
        assert plan.manifest is not None and plan.revision is not None
        man = manifests.load(plan.manifest, plan.repo, plan.revision)
        if man is None:
            return {"verify": {"ok": False, "level": level or plan.verify, "findings": [
                {"code": "missing", "subject": str(plan.manifest), "message": "no manifest: the revision was never fetched",
                 "fix": "gpunode provision --tags model"}], "bad_files": [], "more": {}}}
    return {"verify": check(plan, man, level or plan.verify, source).as_dict()}


__all__ = ["HubRefused", "HubUnreachable", "Plan", "StoreTooSmall", "converge", "offline"]
