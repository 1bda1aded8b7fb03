"""The default base image, made without a registry: ``debootstrap --variant=minbase`` + ``docker import``.

Sites with no registry (and this project's CI, which reaches only PyPI and Debian) get their base
from Debian's own mirror. The base tag is derived from the suite, variant, mirror and package
list; an existing tag is reused, so the base is made once per engine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import docker
from docker.errors import ImageNotFound
from rich.console import Console

from gpunode.image.context import DebootstrapBase

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
