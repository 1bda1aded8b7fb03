"""Serving stacks as data: one folder each under images/sglang/stacks/.

A stack is what the server image installs and how: ``stack.yml`` (why, the profile it runs, the
CUDA it is built with and the driver that needs, the pins and the distributions that carry them,
the CUDA toolchain, the FlashInfer modules its launch compiles on SM120, what stays JIT), the
locks lock.sh resolved from its ``requirements.in`` (one per Python of bases.yml), and the patches
applied in the image. The host file picks one (``image.stack``); a new stack is a new folder and
a new profile, not new code. Nothing here imports the host file's model, so the model can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from gpunode.ground.paths import IMAGES

DEFAULT = "sglang-0.5.9-cu128"  # the seeds' stack: proven on the hardware
PATCHES = "patches"


class StackError(ValueError):
    """A stack that does not exist or cannot be read."""


@dataclass(frozen=True)
class Pin:
    version: str
    distributions: tuple[str, ...]


@dataclass(frozen=True)
class ModuleRule:
    """A FlashInfer JIT module the launch compiles when every flag of ``when`` has one of its values."""

    name: str
    group: str
    generator: str
    why: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    when: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class JitOnly:
    what: str
    why: str


@dataclass(frozen=True)
class VerifyPlan:
    """What image verify checks for a stack beyond pins, toolchain and the modules built ahead of time."""

    kernels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # library -> globs under site-packages
    toolchain_users: Mapping[str, str] = field(default_factory=dict)  # library -> module:function finding CUDA
    entry_points: tuple[str, ...] = ()  # module:attribute
    symbols: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # binary under site-packages -> names
    files: tuple[str, ...] = ()  # under site-packages

    def request(self) -> dict[str, Any]:
        """The probe's part of it (JSON)."""
        return {"toolchain_users": dict(self.toolchain_users), "entry_points": list(self.entry_points),
                "symbols": {path: list(names) for path, names in self.symbols.items()}, "stack_files": list(self.files)}


@dataclass(frozen=True)
class Stack:
    name: str
    folder: Path
    why: str
    profile: str
    base: str  # the base of bases.yml the image builds on unless the host file names another
    cuda: str
    driver_min: int
    exclude_newer: str
    locks: Mapping[str, str]  # Python version -> lock file in the folder
    pins: Mapping[str, Pin]
    toolchain: str | None  # a toolchain of bases.yml the stack brings; None: the base's own
    flag_defaults: Mapping[str, str] = field(default_factory=dict)
    arch_overrides: Mapping[str, str] = field(default_factory=dict)  # a GPU's arch -> the one its FlashInfer builds
    flashinfer_modules: tuple[ModuleRule, ...] = ()
    not_prebuilt: tuple[JitOnly, ...] = ()
    verify: VerifyPlan = VerifyPlan()

    def versions(self) -> dict[str, str]:
        """Pin name -> version: what the image's labels record."""
        return {name: pin.version for name, pin in self.pins.items()}

    def cuda_arch(self, arch: str) -> str:
        """The target this stack's FlashInfer compiles ``arch`` (``12.0a``) as."""
        return self.arch_overrides.get(arch, arch)

    def lock_for(self, python: str) -> str | None:
        return self.locks.get(python)

    def patch_names(self) -> list[str]:
        """Patches in the order they are applied: file name order."""
        folder = self.folder / PATCHES
        return sorted(p.name for p in folder.glob("*.patch")) if folder.is_dir() else []


def stacks_dir() -> Path:
    return IMAGES / "sglang" / "stacks"


def available() -> list[str]:
    return sorted(entry.name for entry in stacks_dir().iterdir() if (entry / "stack.yml").is_file())


def _words(text: Any) -> str:
    return " ".join(str(text or "").split())


def _verify_plan(raw: dict[str, Any]) -> VerifyPlan:
    return VerifyPlan(
        kernels={lib: tuple(globs) for lib, globs in (raw.get("kernels") or {}).items()},
        toolchain_users=dict(raw.get("toolchain_users") or {}),
        entry_points=tuple(raw.get("entry_points") or ()),
        symbols={path: tuple(names) for path, names in (raw.get("symbols") or {}).items()},
        files=tuple(raw.get("files") or ()),
    )


@cache
def load(name: str, root: Path | None = None) -> Stack:
    """The stack of that folder (under ``root``, default the package's stacks folder)."""
    folder = (root or stacks_dir()) / name
    path = folder / "stack.yml"
    if not path.is_file():
        known = ", ".join(available())
        raise StackError(f"unknown stack {name!r} (known: {known})")
    raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        return Stack(
            name=name, folder=folder, why=_words(raw["why"]), profile=raw["profile"], base=raw["base"], cuda=str(raw["cuda"]),
            driver_min=int(raw["driver_min"]), exclude_newer=str(raw["exclude_newer"]),
            locks={str(py): lock for py, lock in raw["locks"].items()},
            pins={pin: Pin(str(entry["version"]), tuple(entry["distributions"])) for pin, entry in raw["pins"].items()},
            toolchain=raw.get("toolchain"),
            flag_defaults={flag: str(value) for flag, value in (raw.get("flag_defaults") or {}).items()},
            arch_overrides={str(k): str(v) for k, v in (raw.get("arch_overrides") or {}).items()},
            flashinfer_modules=tuple(
                ModuleRule(name=m["name"], group=m["group"], generator=m["generator"], why=_words(m["why"]),
                           kwargs=dict(m.get("kwargs") or {}),
                           when={flag: tuple(str(v) for v in (values if isinstance(values, list) else [values]))
                                 for flag, values in (m.get("when") or {}).items()})
                for m in raw.get("flashinfer_modules") or []),
            not_prebuilt=tuple(JitOnly(_words(item["what"]), _words(item["why"])) for item in raw.get("not_prebuilt") or []),
            verify=_verify_plan(raw.get("verify") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StackError(f"{path} is malformed: {type(exc).__name__} {exc}") from None
