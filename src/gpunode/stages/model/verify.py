"""Prove a checkpoint whole before a server loads it: every file of the pinned revision present with
its size and the Hub's hash, every shard's safetensors header readable, every tensor the index
lists in the shard it names, and config.json naming the architecture and quantization the
profile's launch expects. Each problem is a finding that names its file and the fix.

Runs with the model tools on the machine that holds the weights: stdlib, and the ``safetensors``
library (numpy as its array type) for the headers.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.ground.finding import FAIL, Finding
from gpunode.stages.model.manifest import FileEntry, Manifest, Stamp, safe_relative

INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
MAX_JSON_BYTES = 64 * 1024 * 1024  # GLM-5's index is ~6 MB
CHUNK = 1 << 20
SHOWN_PER_CODE = 20  # findings of one kind beyond this are counted, not listed

# What fixes a bad file, by where the weights come from.
FIXES = {
    "hub": "the next provision fetches that file again, and only it (gpunode provision --tags model)",
    "host_path": "copy it again into model.host_path on the Proxmox host, then run gpunode check --layer model",
    "node_path": "copy it again into model.path on the node, then run gpunode check --layer model",
}


# A finding in the report's JSON (and the model stage's record): each a failure; its code is
# missing | size | sha256 | not_a_file | header | index | config, its subject the file (relative to
# the weights folder).
KEYS = {"code": "code", "subject": "subject", "message": "message", "fix": "fix"}


@dataclass
class Report:
    level: str
    files: int = 0
    bytes: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    more: dict[str, int] = field(default_factory=dict)  # findings left out of the list, by code
    stamps: dict[str, Stamp] = field(default_factory=dict)  # the files hashed and found equal, as they are now

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def bad_files(self) -> list[str]:
        """Files a fetch replaces: missing, of the wrong size or hash, or not a file."""
        return sorted({f.subject for f in self.findings
                       if f.code in ("missing", "size", "sha256", "not_a_file") and f.subject != "."})

    def add(self, finding: Finding) -> None:
        if sum(1 for f in self.findings if f.code == finding.code) >= SHOWN_PER_CODE:
            self.more[finding.code] = self.more.get(finding.code, 0) + 1
        else:
            self.findings.append(finding)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "level": self.level, "files": self.files, "bytes": self.bytes,
                "hashed_files": self.hashed_files, "hashed_bytes": self.hashed_bytes, "seconds": round(self.seconds, 3),
                "findings": [f.as_dict(KEYS) for f in self.findings], "more": self.more, "bad_files": self.bad_files}


def git_blob_id(path: Path) -> str:
    """The git blob id of a file (what the Hub lists as a regular file's oid)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """The file's sha256, each byte read once (hashlib releases the GIL: threads hash in parallel)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _read_json(path: Path) -> Any:
    """A JSON file of the checkpoint: a regular file itself (a FIFO would block the open, a link could
    point anywhere), at most MAX_JSON_BYTES."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise ValueError("not a regular file (a link, a FIFO, a folder or a device)")
    with open(path, "rb") as handle:
        data = handle.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"over {MAX_JSON_BYTES} bytes")
    return json.loads(data)


def read_shards(folder: Path) -> dict[str, set[str]] | str:
    """The shards and the tensors each holds, read once from the index (or every *.safetensors, with
    no tensors named, where there is none); or why the index does not read."""
    index = folder / INDEX
    if not index.is_file():
        return {p.name: set() for p in folder.glob("*.safetensors")}
    try:
        weight_map = _read_json(index)["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not a mapping")
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"not a safetensors index ({type(exc).__name__}: {exc})"
    shards: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        shards.setdefault(str(shard), set()).add(str(tensor))
    return shards


def _entries(folder: Path, manifest: Manifest | None, shards: dict[str, set[str]] | str) -> list[FileEntry]:
    """The files to check: the manifest's, or without one (weights gpunode did not fetch) config.json,
    the index and the shards it names (or every *.safetensors where there is no index)."""
    if manifest is not None:
        return manifest.files
    names = {CONFIG, *(shards if isinstance(shards, dict) else ())}
    if (folder / INDEX).is_file():
        names.add(INDEX)
    out = []
    for name in sorted(names):
        try:
            out.append(FileEntry(safe_relative(name), -1, None, None))
        except ValueError:
            continue  # the index check names a shard path that leaves the folder
    return out


def _present(folder: Path, entry: FileEntry, report: Report, fix: str) -> os.stat_result | None:
    try:
        st = os.lstat(folder / entry.path)
    except FileNotFoundError:
        report.add(Finding("missing", FAIL, "is not there", entry.path, fix=fix))
        return None
    if not stat.S_ISREG(st.st_mode):
        report.add(Finding("not_a_file", FAIL, "is not a regular file (a link, a folder or a device)", entry.path,
                           fix=fix))
        return None
    if entry.size >= 0 and st.st_size != entry.size:
        word = "truncated" if st.st_size < entry.size else "too long"
        report.add(Finding("size", FAIL, f"{word}: {st.st_size} bytes, the revision's is {entry.size}", entry.path,
                           fix=fix))
        return None
    return st


def _hash_matches(folder: Path, entry: FileEntry) -> tuple[bool, str]:
    path = folder / entry.path
    if entry.sha256 is not None:
        got = sha256_of(path)
        return got == entry.sha256, f"sha256 {got[:12]}..., the Hub's is {entry.sha256[:12]}..."
    assert entry.blob is not None
    got = git_blob_id(path)
    return got == entry.blob, f"git blob {got[:12]}..., the Hub's is {entry.blob[:12]}..."


def check_files(folder: Path, manifest: Manifest | None, shards: dict[str, set[str]] | str, level: str,
                workers: int, fix: str, report: Report) -> None:
    """Presence, size and (for a manifest) hash: ``full`` hashes every file; ``sizes`` only those
    whose stamp changed since they were last found equal (or that were never hashed)."""
    to_hash: list[tuple[FileEntry, os.stat_result]] = []
    for entry in _entries(folder, manifest, shards):
        st = _present(folder, entry, report, fix)
        if st is None:
            continue
        report.files += 1
        report.bytes += st.st_size
        if manifest is None or (entry.sha256 is None and entry.blob is None):
            continue
        known = manifest.stamps.get(entry.path)
        if level == "full" or known != Stamp.of(st):
            to_hash.append((entry, st))
        else:
            report.stamps[entry.path] = known
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda item: _hash_matches(folder, item[0]), to_hash))
    for (entry, st), (equal, detail) in zip(to_hash, results):
        report.hashed_files += 1
        report.hashed_bytes += st.st_size
        after = os.lstat(folder / entry.path)
        if not equal:
            report.add(Finding("sha256", FAIL, f"its content is not the revision's ({detail})", entry.path, fix=fix))
        elif Stamp.of(after) == Stamp.of(st):  # unchanged while it was read
            report.stamps[entry.path] = Stamp.of(after)


def _shard_keys(path: Path) -> set[str]:
    from safetensors import safe_open  # the header only: safe_open maps the file, reads no tensor

    with safe_open(str(path), framework="numpy") as handle:
        return set(handle.keys())


def check_index(folder: Path, shards: dict[str, set[str]] | str, fix: str, report: Report) -> None:
    """Every shard the index names is there, every tensor it lists is in that shard's header, and
    every shard's header reads (a truncated or overwritten header fails here)."""
    index = folder / INDEX
    if isinstance(shards, str):
        report.add(Finding("index", FAIL, shards, INDEX, fix=fix))
        return
    if not shards:
        report.add(Finding("index", FAIL, "neither an index nor a *.safetensors file is there", INDEX, fix=fix))
        return
    for shard, tensors in sorted(shards.items()):
        try:
            safe_relative(shard)
        except ValueError:
            report.add(Finding("index", FAIL, f"names {shard!r}, a path outside the weights folder", INDEX, fix=fix))
            continue
        path = folder / shard
        if not path.is_file():
            if index.is_file():
                report.add(Finding("index", FAIL, f"is named by {INDEX} but is not there", shard, fix=fix))
            continue
        try:
            keys = _shard_keys(path)
        except Exception as exc:  # the library's SafetensorError, or an OSError reading it
            report.add(Finding("header", FAIL, f"its safetensors header does not read ({' '.join(str(exc).split())[:200]})",
                               shard, fix=fix))
            continue
        for tensor in sorted(tensors - keys):
            report.add(Finding("index", FAIL, f"{INDEX} puts tensor {tensor!r} here, and the header has no such tensor",
                               shard, fix=fix))


def check_config(folder: Path, architecture: str | None, quantization: dict[str, str], fix: str,
                 report: Report) -> None:
    """config.json names the architecture and quantization the launch expects: an architecture the
    stack does not know turns off its sparse-attention set-up (FIELD-NOTES s13), so it is named here,
    not found at load."""
    try:
        config = _read_json(folder / CONFIG)
        if not isinstance(config, dict):
            raise TypeError("not a JSON object")
    except FileNotFoundError:
        return  # the file check names it missing
    except (ValueError, TypeError, OSError) as exc:
        report.add(Finding("config", FAIL, f"does not read ({type(exc).__name__}: {exc})", CONFIG, fix=fix))
        return
    archs = config.get("architectures")
    got = archs[0] if isinstance(archs, list) and archs else None
    if architecture is not None and got != architecture:
        report.add(Finding("config", FAIL, f"architectures[0] is {got!r}, the profile's launch expects {architecture!r} "
                           "(another architecture turns off the sparse-attention set-up on this stack)", CONFIG,
                           fix="use the checkpoint the profile names (model.id), or a profile for this one"))
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    for key, want in quantization.items():
        value = quant.get(key)
        if not isinstance(value, str) or value.lower() != want.lower():
            report.add(Finding("config", FAIL, f"quantization_config.{key} is {value!r}, the profile expects {want!r}",
                               CONFIG, fix="use the checkpoint the profile names (model.id), or a profile for this one"))


def verify(folder: Path, *, manifest: Manifest | None, level: str, workers: int, source: str,
           architecture: str | None, quantization: dict[str, str],
           clock: Callable[[], float] = time.monotonic) -> Report:
    """Every check, one report (README "The model": what each level reads and costs)."""
    start = clock()
    report = Report(level)
    fix = FIXES[source]
    if not folder.is_dir():
        if manifest is not None:  # every file of the revision is missing: a fetch takes them all
            for entry in manifest.files:
                report.add(Finding("missing", FAIL, "is not there (nor is its folder)", entry.path, fix=fix))
            report.seconds = clock() - start
            return report
        report.add(Finding("missing", FAIL, f"the weights folder {folder} is not there", ".", fix=fix))
        return report
    shards = read_shards(folder)  # the index, read once for both checks
    check_files(folder, manifest, shards, level, workers, fix, report)
    check_index(folder, shards, fix, report)
    check_config(folder, architecture, quantization, fix, report)
    report.seconds = clock() - start
    return report
