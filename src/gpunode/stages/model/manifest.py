"""The pinned revision's file list, kept beside the weights: every file's path, size and the Hub's
hash (the LFS sha256 for large files, the git blob id for the rest), written when the revision is
first fetched, so that a re-check needs no network; and the stamps of the files verified since.

Stdlib only: it runs with the model tools on the machine that holds the weights.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a 50k-file repo is ~5 MB; anything larger is not ours
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOB = re.compile(r"[0-9a-f]{40}")


class ManifestError(ValueError):
    """A manifest that is not one this code wrote (damaged, edited, another repo's)."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated, as the Hub lists it
    size: int
    sha256: str | None  # LFS files: the Hub's lfs.oid
    blob: str | None  # the git blob id (sha1 of "blob <size>\0" + content): regular files

    def __post_init__(self) -> None:
        safe_relative(self.path)
        # The listed hash names the file's partial on disk: a mirror's "../x" for an oid would write
        # outside the store, so only what a hash can look like is taken.
        if self.sha256 is not None and not _SHA256.fullmatch(self.sha256):
            raise ManifestError(f"{self.path}: sha256 {self.sha256[:80]!r} is not 64 lowercase hex digits")
        if self.blob is not None and not _BLOB.fullmatch(self.blob):
            raise ManifestError(f"{self.path}: git blob id {self.blob[:80]!r} is not 40 lowercase hex digits")

    @property
    def listed_hash(self) -> str | None:
        """The hash the Hub lists for the file: the LFS sha256, else the git blob id."""
        return self.sha256 or self.blob


@dataclass(frozen=True)
class Stamp:
    """A file as it was when it was last hashed and found equal to the manifest: a change of size,
    inode, mtime or ctime (which no user can set back) means it is hashed again."""

    size: int
    ino: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Manifest:
    repo: str
    revision: str
    files: list[FileEntry]
    stamps: dict[str, Stamp] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "repo": self.repo, "revision": self.revision,
                           "files": [asdict(entry) for entry in self.files],
                           "stamps": {path: asdict(stamp) for path, stamp in sorted(self.stamps.items())}},
                          indent=1) + "\n"


def safe_relative(path: str) -> str:
    """A repo path that stays inside the weights folder: relative, no '..', no empty part, no NUL."""
    parts = path.split("/")  # as written: PurePosixPath would fold "a//b" and "a/./b" away
    if not path or "\0" in path or path.startswith("/") or any(part in ("..", ".", "") for part in parts) \
            or "\\" in path:
        raise ManifestError(f"{path!r} is not a relative path inside the repo")
    return path


def parse(text: str, repo: str, revision: str) -> Manifest:
    """A manifest from its JSON, for ``repo`` at ``revision`` only."""
    try:
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ManifestError(f"format {raw.get('format')!r}, not {FORMAT}")
        if raw.get("repo") != repo or raw.get("revision") != revision:
            raise ManifestError(f"it is for {raw.get('repo')!r} at {raw.get('revision')!r}")
        files = [FileEntry(str(e["path"]), int(e["size"]), e.get("sha256"), e.get("blob")) for e in raw["files"]]
        stamps = {str(p): Stamp(**s) for p, s in (raw.get("stamps") or {}).items()}
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"not a manifest ({type(exc).__name__}: {exc})") from None
    return Manifest(repo, revision, files, stamps)


def load(path: Path, repo: str, revision: str) -> Manifest | None:
    """The manifest at ``path``, or None where there is none yet."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO would block the open
            raise ManifestError(f"{path} is not a regular file")
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        return parse(data.decode("utf-8"), repo, revision)
    except UnicodeDecodeError:
        raise ManifestError(f"{path} is not UTF-8") from None


def save(path: Path, manifest: Manifest) -> None:
    """Write atomically: a killed run leaves the old manifest or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(manifest.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def from_tree(repo: str, revision: str, items: list[dict[str, Any]]) -> Manifest:
    """A manifest from the Hub's tree listing (``list_repo_tree``'s files: path, size, blob_id, lfs)."""
    files = []
    for item in items:
        lfs = item.get("lfs") or {}
        files.append(FileEntry(item["path"], int(lfs.get("size", item["size"])), lfs.get("sha256"),
                               item.get("blob_id")))
    return Manifest(repo, revision, sorted(files, key=lambda entry: entry.path))
