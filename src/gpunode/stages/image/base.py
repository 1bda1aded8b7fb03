"""The image's base: pulled from a registry with its digest recorded, or made without one.

A registry base (``nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04``, the default) is pulled before each
build, and its digest is recorded in the built image's labels. A tag moves upstream when NVIDIA
republishes it: a later build whose pulled digest differs from the one an earlier image of the
same base was built from says so, and a digest in the host file (``...@sha256:``) pins it.

Sites with no registry (and this project's CI, which reaches only PyPI and Debian) get their base
from Debian's own mirror: ``debootstrap --variant=minbase`` + ``docker import``. That base's tag is
derived from the suite, variant, mirror and package list; an existing tag is reused, so the base
is made once per engine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound
from rich.console import Console

from gpunode.catalogue.bases import BaseRef
from gpunode.derive.imagecontext import LABEL_PREFIX, DebootstrapBase

# Left out of the imported tree: the engine provides these at run time, and the caches only cost space.
EXCLUDED = ("./dev/*", "./proc/*", "./sys/*", "./var/cache/apt/archives/*.deb", "./var/lib/apt/lists/*",
            "./var/log/*", "./tmp/*")


class BaseError(RuntimeError):
    """The base image could not be made."""


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except ImageNotFound:
        return False
    return True


def debootstrap_command(spec: DebootstrapBase, target: Path) -> list[str]:
    return ["debootstrap", f"--variant={spec.variant}", f"--include={','.join(sorted(spec.packages))}",
            spec.suite, str(target), spec.mirror]


def run_debootstrap(spec: DebootstrapBase, target: Path, console: Console) -> None:
    if shutil.which("debootstrap") is None:
        raise BaseError("debootstrap is not installed (apt-get install debootstrap), and base 'debootstrap' needs it")
    command = debootstrap_command(spec, target)
    console.print(f"[dim]$ {' '.join(command)}[/]")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        with console.status("debootstrap: starting") as status:
            for line in proc.stdout:
                tail = (tail + [line.rstrip()])[-20:]
                status.update(f"debootstrap: {line.strip()[:100]}")
        if proc.wait() != 0:
            raise BaseError(f"debootstrap failed (exit {proc.returncode}):\n" + "\n".join(tail))


def import_tree(client: docker.DockerClient, root: Path, ref: str, workdir: Path) -> None:
    """Tar the tree (numeric owners, engine-provided dirs left out) and import it as ``ref``."""
    archive = workdir / "rootfs.tar"
    excludes = [f"--exclude={pattern}" for pattern in EXCLUDED]
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), *excludes, "-cf", str(archive), "."], check=True)
    repository, tag = ref.rsplit(":", 1)
    client.api.import_image_from_file(str(archive), repository=repository, tag=tag,
                                      changes=['CMD ["/bin/bash"]'])


def ensure_debootstrap_base(client: docker.DockerClient, spec: DebootstrapBase, console: Console) -> bool:
    """Make the base on the engine unless its tag exists. Returns whether it was made."""
    if image_exists(client, spec.ref):
        console.print(f"base {spec.ref}: present")
        return False
    started = time.monotonic()
    console.print(f"base {spec.ref}: making it with debootstrap ({spec.suite}, {len(spec.packages)} packages)")
    with tempfile.TemporaryDirectory(prefix="gpunode-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        run_debootstrap(spec, root, console)
        import_tree(client, root, spec.ref, Path(tmp))
    if not image_exists(client, spec.ref):
        raise BaseError(f"docker import did not produce {spec.ref}")
    console.print(f"base {spec.ref}: made in {time.monotonic() - started:.0f} s")
    return True


@dataclass(frozen=True)
class BaseDigest:
    """The registry base a build starts from: its digest as pulled, and the digests earlier
    gpunode images on this engine were built from under the same name when they differ."""

    ref: str
    digest: str | None
    earlier: tuple[tuple[str, str], ...] = ()  # (image tag, digest) built from another digest

    def moved(self) -> str | None:
        """One line when the tag now names other content than an earlier build used."""
        if not self.earlier or self.digest is None:
            return None
        tag, digest = self.earlier[0]
        return (f"base {self.ref} now has digest {self.digest}, but {tag} was built from {digest}: the tag moved "
                f"upstream. To build from the earlier content, set image.base: {self.ref}@{digest}")


def repo_digest(client: docker.DockerClient, ref: str) -> str | None:
    """The content digest the engine recorded when it pulled ``ref`` (``repository:tag``; RepoDigests), if any."""
    repository = ref.rsplit(":", 1)[0]
    for entry in client.images.get(ref).attrs.get("RepoDigests") or []:
        name, _, digest = entry.partition("@")
        if name == repository:
            return digest
    return None


def earlier_digests(client: docker.DockerClient, ref: str, digest: str | None) -> tuple[tuple[str, str], ...]:
    """gpunode images on the engine built from ``ref`` with a digest other than ``digest``."""
    found = []
    for image in client.images.list(filters={"label": f"{LABEL_PREFIX}.base={ref}"}):
        recorded = (image.labels or {}).get(f"{LABEL_PREFIX}.base.digest")
        if recorded and recorded != digest:
            found.append(((image.tags or [image.short_id])[0], recorded))
    return tuple(sorted(found))


def ensure_registry_base(client: docker.DockerClient, base: BaseRef, console: Console) -> BaseDigest:
    """Pull the base (a pinned digest only when absent) and report its digest; a digest that
    differs from an earlier build's is said, not hidden."""
    if base.digest and image_exists(client, base.pull_ref):
        console.print(f"base {base.pull_ref}: present (pinned)")
        return BaseDigest(base.tag_ref, base.digest)
    console.print(f"base {base.pull_ref}: pulling")
    try:
        client.images.pull(base.pull_ref)
    except APIError as exc:
        if base.digest or not image_exists(client, base.pull_ref):
            raise BaseError(f"cannot pull {base.pull_ref}: {exc.explanation or exc}") from None
        console.print(f"[yellow]base {base.pull_ref}: pull failed ({exc.explanation or exc}); using the copy "
                      "on the engine[/]")
    digest = base.digest or repo_digest(client, base.tag_ref)
    found = BaseDigest(base.tag_ref, digest, earlier_digests(client, base.tag_ref, digest))
    console.print(f"base {base.tag_ref}: digest {digest or 'unknown (not pulled from a registry)'}")
    if (moved := found.moved()) is not None:
        console.print(f"[yellow]{moved}[/]")
    return found
