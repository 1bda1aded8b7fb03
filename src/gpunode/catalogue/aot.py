"""FlashInfer's kernels ahead of time: which modules a server profile's launch compiles, for which arch.

On SM120 FlashInfer 0.6.3 ships no cubins (flashinfer-cubin has sm_100/103 only), so every
FlashInfer kernel the launch touches is JIT-compiled with nvcc at first use (FIELD-NOTES s8). The
image build compiles them instead, for the host file's GPU arch, into FlashInfer's AOT directory
(``flashinfer/data/aot/<name>/<name>.so``), where FlashInfer looks before it compiles.

The list is derived from the launch flags by the stack's rules (stack.yml ``flashinfer_modules``:
each module with the flags that make the launch compile it, and the source that says so); a module
is described by FlashInfer's own generator and arguments, so the image build and ``image verify``
ask FlashInfer itself for the spec. ``name`` is FlashInfer's URI for it, checked against
FlashInfer's generators in the built image. Pure: no torch, no FlashInfer import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpunode.catalogue.stacks import Stack
from gpunode.catalogue.profiles import FlagValue, Profile, merged_flags


@dataclass(frozen=True)
class GpuArch:
    model: str
    cuda_arch: str  # FLASHINFER_CUDA_ARCH_LIST / TORCH_CUDA_ARCH_LIST form: "12.0a"

    @property
    def sm(self) -> str:
        """The SASS target as cuobjdump names it: ``sm_120a``."""
        major, minor = self.cuda_arch.rstrip("af").split(".")
        return f"sm_{major}{minor}{self.cuda_arch[-1] if self.cuda_arch[-1] in 'af' else ''}"


# The arch-specific ("a") targets: FlashInfer's SM120 GEMM/MoE/FP4 kernels use sm_120a features.
GPU_ARCHS: dict[str, GpuArch] = {model: GpuArch(model, arch) for model, arch in (
    ("RTX PRO 6000 Blackwell", "12.0a"),
    ("RTX 5090", "12.0a"),
    ("B200", "10.0a"),
    ("H200", "9.0a"),
    ("H100", "9.0a"),
)}


def gpu_arch(model: str) -> GpuArch:
    return GPU_ARCHS[model]


@dataclass(frozen=True)
class AotModule:
    """One FlashInfer JIT module: its name, the build step (group) it is compiled in, and how to
    ask FlashInfer for its spec: ``generator`` (``module:function``) called with ``kwargs``, where a
    value ``"dtype:<name>"`` stands for ``torch.<name>``."""

    name: str
    group: str
    generator: str
    why: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "generator": self.generator, "kwargs": dict(self.kwargs)}


def modules_json(modules: list[AotModule]) -> str:
    """The modules as the in-image builder and the probe read them: compact JSON, no quotes to escape."""
    text = json.dumps([m.as_json() for m in modules], separators=(",", ":"), sort_keys=True)
    assert "'" not in text  # it goes into a single-quoted shell word
    return text


@dataclass(frozen=True)
class AotPlan:
    """What the image build compiles ahead of time: ``modules`` (empty with ``note`` saying why)
    out of ``wanted``, the profile's list, for ``arch``."""

    arch: GpuArch
    wanted: tuple[AotModule, ...]
    modules: tuple[AotModule, ...]
    note: str = ""

    def groups(self) -> list[tuple[str, list[AotModule]]]:
        """Modules by build step, in first-seen order: one image layer per group."""
        out: dict[str, list[AotModule]] = {}
        for module in self.modules:
            out.setdefault(module.group, []).append(module)
        return list(out.items())


def plan_for(arch: GpuArch, wanted: list[AotModule], choice: str | list[str], has_toolchain: bool,
             base: str) -> AotPlan:
    """The modules to build: the profile's (``profile``), none, or the named subset; none at all
    without a toolchain, and the note says so."""
    if choice == "none":
        return AotPlan(arch, tuple(wanted), (), "image.flashinfer_aot is none: FlashInfer compiles them at first use")
    chosen = [m for m in wanted if choice == "profile" or m.name in choice]
    if not has_toolchain:
        return AotPlan(arch, tuple(wanted), (), f"base {base} has no CUDA toolchain (nvcc): nothing can be built "
                       "ahead of time, and FlashInfer cannot compile them at first use either")
    note = "" if len(chosen) == len(wanted) else f"{len(chosen)} of the profile's {len(wanted)} (image.flashinfer_aot)"
    return AotPlan(arch, tuple(wanted), tuple(chosen), note)


def profile_modules(stack: Stack, profile: Profile, overrides: Mapping[str, FlagValue]) -> list[AotModule]:
    """The FlashInfer modules the profile's launch (with the host file's flag overrides) compiles on
    SM120, by the stack's rules (stack.yml ``flashinfer_modules``): a rule applies when each flag of
    its ``when`` has one of the values given, a flag the launch leaves unset reading the stack's
    parser default."""
    flags = {flag: value for flag, value in merged_flags(profile, overrides).items() if value is not False}

    def value(flag: str) -> str | None:
        if flag in flags:
            return None if flags[flag] is None or flags[flag] is True else str(flags[flag])
        return stack.flag_defaults.get(flag)

    return [AotModule(rule.name, rule.group, rule.generator, rule.why, rule.kwargs)
            for rule in stack.flashinfer_modules
            if all(value(flag) in values for flag, values in rule.when.items())]
