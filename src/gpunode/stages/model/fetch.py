"""Fetch exactly the pinned revision into the store with huggingface_hub, and prove it whole.

One ``converge`` per run: the manifest kept beside the weights says what the revision holds (read
from the Hub's tree listing once, so that a converged node needs no network at all); the files
that are missing, short or not the revision's are fetched again with ``snapshot_download`` into
``local_dir`` (resumable: an interrupted file goes on from its ``.incomplete`` part with a Range
request), after a disk preflight against the store's free space; then everything is verified.

Runs with the model tools on the machine that holds the weights (``python -m gpunode.stages.model``).
"""

from __future__ import annotations

import fcntl
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.stages.model import manifest as manifests
from gpunode.stages.model.verify import Report, verify

PROBE_TIMEOUT_S = 10.0  # the Hub's first answer; an unreachable one fails inside 15 s
PROGRESS_EVERY_S = 1.0
HF_META = Path(".cache") / "huggingface" / "download"  # huggingface_hub's local_dir metadata (_local_folder.py)


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
    return manifests.from_tree(plan.repo, plan.revision, items)


def _partial_bytes(folder: Path) -> int:
    """Bytes already in huggingface_hub's unfinished downloads (resumed, not fetched again)."""
    meta = folder / HF_META
    return sum(p.stat().st_size for p in meta.rglob("*.incomplete")) if meta.is_dir() else 0


def preflight(plan: Plan, man: manifests.Manifest, paths: list[str]) -> tuple[int, int]:
    """(bytes still to fetch, bytes free in the store); raises StoreTooSmall naming both."""
    sizes = {entry.path: entry.size for entry in man.files}
    need = max(0, sum(sizes[p] for p in paths) - _partial_bytes(plan.weights_dir))
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


def _escape(path: str) -> str:
    """A repo path as an fnmatch pattern that matches only itself (allow_patterns are fnmatch's)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in path)


def _forget(plan: Plan, man: manifests.Manifest, path: str) -> None:
    """Drop a bad file, its stamp and its local metadata, so that the fetch takes it from the Hub again."""
    man.stamps.pop(path, None)
    (plan.weights_dir / path).unlink(missing_ok=True)
    (plan.weights_dir / HF_META / f"{path}.metadata").unlink(missing_ok=True)


def _on_disk(folder: Path, paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            total += (folder / path).stat().st_size
        except OSError:
            pass
    return total + _partial_bytes(folder)


@contextmanager
def progress(plan: Plan, paths: list[str], total: int, emit: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """A progress line each second (bytes, rate, ETA), read from the disk: what huggingface_hub
    has written of the files being fetched, finished or not."""
    stop = threading.Event()
    start, base = time.monotonic(), _on_disk(plan.weights_dir, paths)

    def tick() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            done = _on_disk(plan.weights_dir, paths)
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


def download(plan: Plan, paths: list[str], token: str | None) -> None:
    """snapshot_download of exactly these files of the pinned revision into the weights folder."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(plan.repo, revision=plan.revision, local_dir=plan.weights_dir, endpoint=plan.endpoint,
                          token=token or False, max_workers=plan.workers, allow_patterns=[_escape(p) for p in paths])
    except Exception as exc:
        raise _hub_error(exc, token) from None


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
            need, _free = preflight(plan, man, fetch)
            for path in fetch:
                _forget(plan, man, path)
            fetching = set(fetch)
            total = sum(entry.size for entry in man.files if entry.path in fetching)
            emit({"fetching": {"files": len(fetch), "bytes": total, "to_fetch": need}})
            with progress(plan, fetch, total, emit):
                download(plan, fetch, token)
            out.update(changed=True, fetched=fetch, fetched_bytes=need)
        man.stamps = {**man.stamps, **report.stamps}
        if fetch:
            # The fetched files are hashed now (full for them: nothing proves them yet).
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
