"""The bases and toolchains the server image can build on, as data (images/sglang/bases.yml).

A base in the host file is a known name, optionally behind a site's registry mirror
(``registry.example:5000/nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04``) and optionally pinned by
digest (``...@sha256:<64 hex>``). Its entry says which Python it has (the stack's lock for that
Python is installed) and which CUDA toolchain it carries. Nothing here imports the host file's model, so the model can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import yaml

from gpunode.ground.paths import IMAGES
from gpunode.ground.text import shown

DEBOOTSTRAP = "debootstrap"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# A registry host is the first path part when it has a dot or a port, or is localhost (Docker's rule).
_REGISTRY = re.compile(r"^(localhost|[^/]*[.:][^/]*)/")


class BaseRefError(ValueError):
    """A base name the catalog does not know, or a malformed digest."""


@dataclass(frozen=True)
class Toolchain:
    name: str
    cuda: str
    cuda_home: str
    source: str
    lab_only: bool
    lock: str | None = None  # a toolchain of its own venv; None with in_stack
    in_stack: bool = False  # installed by the stack's own lock, in the server's venv
    why: str = ""


@dataclass(frozen=True)
class Base:
    name: str  # the catalog's name: no mirror, no digest
    python: str  # the stack's lock for this Python is the one installed
    toolchain: str | None
    why: str


@dataclass(frozen=True)
class BaseRef:
    """A host file's base, taken apart: where it is pulled from and whether a digest pins it."""

    text: str
    registry: str | None
    name: str
    digest: str | None

    @property
    def pull_ref(self) -> str:
        """What the engine pulls and FROM names: the digest, when given, pins the content."""
        return self.text

    @property
    def tag_ref(self) -> str:
        """The base without its digest: the name a moving tag lives under."""
        return self.text.split("@", 1)[0]

    @property
    def local(self) -> bool:
        return self.name == DEBOOTSTRAP


@cache
def _catalog() -> dict[str, dict]:  # type: ignore[type-arg]
    data: dict = yaml.safe_load((IMAGES / "sglang" / "bases.yml").read_text(encoding="utf-8"))  # type: ignore[type-arg]
    return data


def bases() -> dict[str, Base]:
    return {name: Base(name=name, python=str(entry["python"]), toolchain=entry.get("toolchain"),
                       why=" ".join(str(entry.get("why", "")).split()))
            for name, entry in _catalog()["bases"].items()}


def toolchains() -> dict[str, Toolchain]:
    return {name: Toolchain(name=name, cuda=str(entry["cuda"]), cuda_home=entry["cuda_home"], source=entry["source"],
                            lab_only=bool(entry["lab_only"]), lock=entry.get("lock"),
                            in_stack=bool(entry.get("in_stack", False)),
                            why=" ".join(str(entry.get("why", "")).split()))
            for name, entry in _catalog()["toolchains"].items()}


def parse(text: str) -> BaseRef:
    """Take a host file's ``image.base`` apart; an unknown name or bad digest is a BaseRefError."""
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise BaseRefError(f"{shown(text, quote=True)}: a digest is sha256:<64 lowercase hex>")
    registry = None
    if (mirror := _REGISTRY.match(rest)) and rest[mirror.end():] in bases():
        registry, rest = mirror[1], rest[mirror.end():]
    if rest not in bases():
        raise BaseRefError(f"unknown base {shown(rest, quote=True)} (known: {', '.join(bases())}; a registry mirror "
                           "may prefix one)")
    if rest == DEBOOTSTRAP and (registry or digest):
        raise BaseRefError("debootstrap is made on this machine: it takes no registry and no digest")
    return BaseRef(text=text, registry=registry, name=rest, digest=digest or None)


def base_of(text: str) -> Base:
    return bases()[parse(text).name]


def toolchain_for(base_text: str, choice: str, stack_toolchain: str | None = None) -> Toolchain | None:
    """The image's toolchain: the stack's own when it brings one, else the base's own (``choice``
    'base'), or a named one layered on top."""
    if stack_toolchain:
        return toolchains()[stack_toolchain]
    if choice == "base":
        own = base_of(base_text).toolchain
        return toolchains()[own] if own else None
    return toolchains()[choice]
