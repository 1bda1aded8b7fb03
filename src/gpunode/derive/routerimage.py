"""The router's image inputs: SGLang's router, hash-locked (images/router/requirements.lock), in its
own small image on a Debian base, with the server image's bases and pip lock, tagged by content: equal
inputs, equal tag (the router stage builds it: gpunode.stages.router.build)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from gpunode.catalogue import bases
from gpunode.derive.imagecontext import (
    CA_IN_CONTEXT, PIP_LOCK, BuildContext, DebootstrapBase, ImageInputError, images_dir,
)
from gpunode.ground.paths import IMAGES

FOLDER = IMAGES / "router"
NAME = "gpunode/sglang-router"
VENV = "/opt/router"
LOCK = "requirements.lock"
LAUNCHER = "launch.py"
# What the router needs of the base: an interpreter for the lock (CPython 3.11) and a venv.
PACKAGES = ("python3", "python3-venv", "ca-certificates")
LOCK_PYTHON = "3.11"


@dataclass(frozen=True)
class RouterInputs(BuildContext):
    base: str  # the host file's router.image.base (bases.yml)
    base_ref: str  # what the build starts FROM
    debootstrap: DebootstrapBase | None
    version: str  # sglang-router's, from the lock

    @property
    def tag(self) -> str:
        return f"{NAME}:{self.version}-{self.digest()[:12]}"


def locked_version(lock: str, name: str = "sglang-router") -> str:
    for line in lock.splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].split()[0]
    raise ImageInputError(f"{FOLDER / LOCK} has no {name} pin: re-lock with images/sglang/lock.sh")


def collect(base: str, ca_bundle: Path | None) -> RouterInputs:
    """The router image's inputs for a base of bases.yml (its Python must be the lock's)."""
    ref = bases.parse(base)
    python = bases.base_of(base).python
    if python != LOCK_PYTHON:
        raise ImageInputError(f"router.image.base {base} has Python {python}; the router's lock is for {LOCK_PYTHON}")
    debootstrap = DebootstrapBase(PACKAGES) if ref.local else None
    files = {LOCK: (FOLDER / LOCK).read_bytes(), PIP_LOCK: (images_dir() / PIP_LOCK).read_bytes(),
             LAUNCHER: (FOLDER / LAUNCHER).read_bytes()}
    if ca_bundle is not None:
        if not ca_bundle.is_file():
            raise ImageInputError(f"router.image.ca_bundle {ca_bundle} is not a readable file")
        files[CA_IN_CONTEXT] = ca_bundle.read_bytes()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    base_ref = debootstrap.ref if debootstrap else ref.pull_ref
    dockerfile = env.from_string((FOLDER / "Dockerfile.j2").read_text()).render(
        base_ref=base_ref, apt_packages=[] if debootstrap else list(PACKAGES), venv=VENV,
        ca_bundle=CA_IN_CONTEXT if ca_bundle is not None else None,
        pip_env="PIP_CERT=/etc/ssl/certs/ca-certificates.crt " if ca_bundle is not None else "")
    return RouterInputs(dockerfile, files, base, base_ref, debootstrap, locked_version(files[LOCK].decode()))
