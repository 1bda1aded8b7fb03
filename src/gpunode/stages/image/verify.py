"""Verify a built image without a GPU: pins, CUDA 12.8, patches applied, sm_120 kernels, launch flags.

The probe (``probe.py``) runs inside the image with no network and reports facts; the functions
here turn facts into named findings, each pass/fail with its detail. They are pure, so the logic
is unit-tested without Docker.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import docker
from docker.errors import DockerException, ImageNotFound

from gpunode.catalogue import stacks
from gpunode.catalogue.aot import GPU_ARCHS, AotPlan
from gpunode.stages.image.build import docker_client
from gpunode.derive.imagecontext import AOT_BUILDER, LABEL_PREFIX, expected_versions, images_dir, version_matches
from gpunode.catalogue.patches import Patch, blocks_present, parse_patch
from gpunode.ground.finding import FAIL, OK, Finding

PROBE_MARK = "GPUNODE-PROBE "
PROBE_TIMEOUT_S = 1200  # cuobjdump over torch's ~1 GB of CUDA libraries takes a while on 2 cores
TARGET_ARCH = "sm_120"
DEFAULT_CUDA_ARCH = GPU_ARCHS["RTX PRO 6000 Blackwell"].cuda_arch  # the mission's GPUs, when the image records none
DEFAULT_DEVEL_BASE = stacks.load(stacks.DEFAULT).base  # the seeds' stack's base: CUDA 12.8's devel image
LISTED_FILES = 4  # files lacking the target named in a detail; the rest are counted


class VerifyError(RuntimeError):
    """The image could not be probed at all (missing, or the probe crashed)."""


def _severity(ok: bool) -> str:
    """Every finding here passes or fails: ok or fail."""
    return OK if ok else FAIL


def finding_as_dict(finding: Finding) -> dict[str, Any]:
    """A finding in the report's JSON: its code as name, whether it passed, its message as detail."""
    return {"name": finding.code, "ok": finding.ok, "detail": finding.message}


@dataclass
class VerifyReport:
    tag: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def failed(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def to_json(self) -> str:
        return json.dumps({"tag": self.tag, "ok": self.ok, "findings": [finding_as_dict(f) for f in self.findings]},
                          indent=2)


# ---- judging facts (pure) ------------------------------------------------------------------

def pin_findings(versions: Mapping[str, str | None], pins: Mapping[str, str], stack: stacks.Stack) -> list[Finding]:
    findings = []
    for dist, pin in expected_versions(pins, stack).items():
        found = versions.get(dist)
        ok = version_matches(pin, found)
        detail = f"{dist} {found} installed, pinned {pin}" if found else f"{dist} is not installed (pinned {pin})"
        findings.append(Finding(f"pin {dist}", _severity(ok), detail if ok else "MISMATCH: " + detail))
    return findings


def torch_cuda_finding(torch: dict[str, Any], pins: Mapping[str, str]) -> Finding:
    if "error" in torch:
        return Finding("torch CUDA", FAIL, f"import torch failed: {torch['error']}")
    cuda = torch.get("cuda")
    ok = cuda is not None and version_matches(pins["cuda"], cuda)
    return Finding("torch CUDA", _severity(ok),
                   f"torch {torch.get('version')} is built for CUDA {cuda}, pinned {pins['cuda']}")


_RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")


def tool_finding(name: str, fact: dict[str, str | None], cuda: str, why: str) -> Finding:
    path, text = fact.get("path"), fact.get("version") or ""
    if not path:
        return Finding(name, FAIL, f"no {name} in the image ({why})")
    release = _RELEASE.search(text)
    if not release:
        return Finding(name, FAIL, f"{path}: cannot read its version: {text[:200]}")
    ok = version_matches(cuda, release[2])
    return Finding(name, _severity(ok), f"{path}: CUDA {release[2]}, pinned {cuda}")


def patch_finding(patch: Patch, files: dict[str, str | None]) -> Finding:
    missing = []
    for target, blocks in patch.added_blocks.items():
        text = files.get(target)
        if text is None:
            missing.append(f"{target} is not installed")
        elif not blocks_present(blocks, text):
            missing.append(f"{target} lacks the patched text")
    if missing:
        return Finding(f"patch {patch.name}", FAIL, "; ".join(missing))
    return Finding(f"patch {patch.name}", OK, "patched text present in " + ", ".join(patch.added_blocks))


def arch_family(target: str, arch: str) -> str | None:
    """How ``arch`` relates to ``target`` (sm_120): 'exact', 'arch-specific' (sm_120a), 'family' (sm_120f)."""
    if arch == target:
        return "exact"
    if arch == target + "a":
        return "arch-specific"
    if arch == target + "f":
        return "family"
    return None


def kernels_finding(library: str, facts: dict[str, Any], target: str) -> Finding:
    """Passes when some binary of the library has SASS (ELF) that runs on ``target``. The detail
    says how many binaries do, which do not, and whether ``target`` has PTX only."""
    binaries: dict[str, dict[str, list[str]]] = facts.get("binaries", {})
    name = f"kernels {library}"
    if not binaries:
        return Finding(name, FAIL, f"{facts.get('files', 0)} files matched, none with device code"
                       + (f"; {facts['errors'][0]}" if facts.get("errors") else ""))
    with_sass = {path for path, found in binaries.items() if any(arch_family(target, a) for a in found["elf"])}
    with_ptx = {path for path, found in binaries.items() if any(arch_family(target, a) for a in found["ptx"])}
    parts = [f"{len(binaries)} binaries with device code; SASS for {target}: {len(with_sass)}"]
    families = sorted({a for found in binaries.values() for a in found["elf"] if arch_family(target, a)})
    if families:
        parts[0] += " (" + ", ".join(f"{a} {arch_family(target, a)}" for a in families) + ")"
    parts.append("SASS per arch (binaries): " + ", ".join(f"{a} {n}" for a, n in _arch_counts(binaries, "elf")))
    ptx_only = sorted(with_ptx - with_sass)
    if ptx_only:
        parts.append(f"PTX only for {target} (driver JIT at first load): {_some(ptx_only)}")
    lacking = sorted(set(binaries) - with_sass - with_ptx)
    if lacking:
        parts.append(f"no {target} code in {len(lacking)}: {_some(lacking)}")
    if facts.get("errors"):
        parts.append(f"{len(facts['errors'])} errors, first: {facts['errors'][0]}")
    return Finding(name, _severity(bool(with_sass) and not facts.get("errors")), "; ".join(parts))


def _arch_counts(binaries: dict[str, dict[str, list[str]]], listing: str) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for found in binaries.values():
        for arch in found[listing]:
            counts[arch] = counts.get(arch, 0) + 1
    return sorted(counts.items(), key=lambda item: _arch_number(item[0]))


def _some(paths: list[str]) -> str:
    shown = ", ".join(Path(p).name for p in paths[:LISTED_FILES])
    return shown + (f" and {len(paths) - LISTED_FILES} more" if len(paths) > LISTED_FILES else "")


def _arch_number(arch: str) -> tuple[int, str]:
    digits = re.search(r"\d+", arch)
    return (int(digits[0]) if digits else 0, arch)


def argv_finding(result: dict[str, Any]) -> Finding:
    if result.get("ok"):
        return Finding("server flags", OK, f"accepted by sglang's parser ({len(result.get('values', {}))} options)")
    return Finding("server flags", FAIL, f"rejected by sglang's parser: {result.get('error')}")


def model_finding(facts: dict[str, Any]) -> Finding:
    ok = bool(facts.get("transformers_glm_moe_dsa")) and bool(facts.get("sglang_glm5_class"))
    detail = (f"transformers knows glm_moe_dsa: {bool(facts.get('transformers_glm_moe_dsa'))}; "
              f"sglang has GlmMoeDsaForCausalLM: {bool(facts.get('sglang_glm5_class'))}")
    errors = [facts[k] for k in ("transformers_error", "sglang_error") if k in facts]
    return Finding("GLM-5 support", _severity(ok), detail + ("; " + "; ".join(errors) if errors else ""))


NO_NVCC = ("FlashInfer compiles its SM120 kernels with $CUDA_HOME/bin/nvcc at the first request, and the server "
           f"stops there without it. Fix: image.base {DEFAULT_DEVEL_BASE} (CUDA 12.8's toolchain)")


def nvcc_compile_finding(fact: dict[str, Any], cuda_arch: str) -> Finding:
    name = f"nvcc compiles for {cuda_arch}"
    if not fact.get("ok"):
        return Finding(name, FAIL,
                       f"{fact.get('error', 'not run')}" + (f" ({fact['command']})" if "command" in fact else ""))
    target = sm_of(cuda_arch)
    ok = any(arch_family(target, arch) for arch in fact.get("sass", []))
    return Finding(name, _severity(ok),
                   f"a test kernel compiled to {', '.join(fact.get('sass', [])) or 'no SASS'}, target {target}")


def sm_of(cuda_arch: str) -> str:
    """``12.0a`` -> ``sm_120`` (the family cuobjdump's arch names are matched against)."""
    return "sm_" + re.sub(r"[^0-9]", "", cuda_arch)


def aot_findings(facts: dict[str, Any], expected: list[dict[str, Any]], cuda_arch: str, nvcc: bool) -> list[Finding]:
    """One finding per module built ahead of time: FlashInfer's lookup (JIT disabled) resolves it to
    the AOT library, and that library holds SASS for the target. None expected is a finding too."""
    if not expected:
        if nvcc:
            return [Finding("flashinfer aot", OK, "no module built ahead of time: FlashInfer compiles at first use")]
        return [Finding("flashinfer aot", FAIL, "no module built ahead of time and no nvcc to compile one at first "
                        "use: every FlashInfer kernel without a cubin fails on SM120")]
    target = sm_of(cuda_arch)
    findings = []
    for entry in expected:
        name, fact = entry["name"], facts.get(entry["name"], {})
        label = f"flashinfer aot {name}"
        if "error" in fact or not fact:
            findings.append(Finding(label, FAIL, f"FlashInfer cannot make its spec: {fact.get('error', 'not probed')}"))
        elif fact.get("spec_name") != name:
            findings.append(Finding(label, FAIL, f"FlashInfer names this module {fact.get('spec_name')}"))
        elif not fact.get("is_aot") or fact.get("library") != fact.get("aot_path"):
            findings.append(Finding(label, FAIL, f"not in FlashInfer's AOT directory ({fact.get('aot_path')}): with "
                                    "FLASHINFER_DISABLE_JIT=1 the launch fails, without it FlashInfer compiles it"))
        else:
            sass = fact.get("sass", [])
            ok = any(arch_family(target, arch) for arch in sass) and not fact.get("errors")
            findings.append(Finding(label, _severity(ok), f"{fact['aot_path']} ({fact.get('size', 0)} bytes): SASS "
                                    f"{', '.join(sass) or 'none'}, target {target}"
                                    + (f"; {fact['errors'][0]}" if fact.get("errors") else "")))
    return findings


def toolchain_user_findings(facts: dict[str, Any], users: Mapping[str, str], cuda: str) -> list[Finding]:
    """Each library that compiles at run time finds the image's nvcc, of the toolchain's CUDA, its own way."""
    findings = []
    for library, spec in users.items():
        fact = facts.get(library, {})
        name = f"nvcc found by {library}"
        if "error" in fact or not fact:
            findings.append(Finding(name, FAIL, f"{spec}: {fact.get('error', 'not probed')}"))
            continue
        release = _RELEASE.search(fact.get("version") or "")
        if not release:
            findings.append(Finding(name, FAIL,
                                    f"{spec} -> {fact.get('found')}: no runnable nvcc at {fact.get('nvcc')}"))
            continue
        findings.append(Finding(name, _severity(version_matches(cuda, release[2])),
                                f"{spec} -> {fact['nvcc']}: CUDA {release[2]}, pinned {cuda}"))
    return findings


def stack_part_findings(facts: dict[str, Any], plan: stacks.VerifyPlan) -> list[Finding]:
    """The stack's entry points, kernel symbols and JIT sources, each present."""
    findings = []
    for entry in plan.entry_points:
        why = facts.get("entry_points", {}).get(entry, "not probed")
        findings.append(Finding(f"entry point {entry}", _severity(why is None), "present" if why is None else why))
    for binary in plan.symbols:
        fact = facts.get("symbols", {}).get(binary, {"error": "not probed"})
        if "error" in fact:
            findings.append(Finding(f"symbols {binary}", FAIL, fact["error"]))
        else:
            findings.append(Finding(f"symbols {binary}", _severity(not fact["missing"]),
                                    f"holds {', '.join(fact['present']) or 'none'}"
                                    + (f"; lacks {', '.join(fact['missing'])}" if fact["missing"] else "")))
    for path in plan.files:
        present = bool(facts.get("stack_files", {}).get(path))
        findings.append(Finding(f"file {path}", _severity(present), "present" if present else "missing"))
    return findings


def judge(facts: dict[str, Any], pins: Mapping[str, str], stack: stacks.Stack, patches: list[Patch], target: str, *,
          tool_cuda: str | None = None, cuda_arch: str = "", aot: list[dict[str, Any]] | None = None) -> list[Finding]:
    """All findings, in a fixed order, from the probe's facts. ``tool_cuda``: the CUDA release of
    the image's toolchain (default: the pinned one); ``aot``: the modules built ahead of time."""
    tools = facts.get("tools", {})
    findings = pin_findings(facts.get("versions", {}), pins, stack)
    findings.append(torch_cuda_finding(facts.get("torch", {}), pins))
    findings.append(tool_finding("nvcc", tools.get("nvcc", {}), tool_cuda or pins["cuda"], NO_NVCC))
    findings.append(tool_finding("ptxas", tools.get("ptxas", {}), tool_cuda or pins["cuda"],
                                 "Triton and FlashInfer assemble PTX with it"))
    if cuda_arch:
        findings.append(nvcc_compile_finding(facts.get("nvcc_compile", {}), cuda_arch))
    findings.extend(toolchain_user_findings(facts.get("toolchain_users", {}), stack.verify.toolchain_users,
                                            tool_cuda or pins["cuda"]))
    findings.extend(aot_findings(facts.get("aot", {}), aot or [], cuda_arch, bool(tools.get("nvcc", {}).get("path"))))
    findings.extend(patch_finding(patch, facts.get("files", {})) for patch in patches)
    findings.extend(kernels_finding(lib, lib_facts, target) for lib, lib_facts in facts.get("kernels", {}).items())
    findings.append(argv_finding(facts.get("server_argv", {})))
    findings.append(model_finding(facts.get("model", {})))
    findings.extend(stack_part_findings(facts, stack.verify))
    return findings


def server_args_after_module(launch_argv: list[str]) -> list[str]:
    """The arguments sglang's parser sees: what follows ``-m <module>`` (or the argv as given)."""
    if "-m" in launch_argv:
        return list(launch_argv[launch_argv.index("-m") + 2:])
    return list(launch_argv)


# ---- running the probe ---------------------------------------------------------------------

def load_patches(stack: stacks.Stack) -> list[Patch]:
    return [parse_patch(name, (stack.folder / stacks.PATCHES / name).read_text(encoding="utf-8"))
            for name in stack.patch_names()]


def stack_from_labels(labels: dict[str, str], folder: Path | None = None) -> stacks.Stack:
    """The stack the image was built from (an image from before stacks: the seeds')."""
    return stacks.load(labels.get(f"{LABEL_PREFIX}.stack", stacks.DEFAULT), (folder or images_dir()) / "stacks")


def pins_from_labels(labels: dict[str, str], stack: stacks.Stack) -> dict[str, str]:
    """The pins the image records, over its stack's."""
    prefix = f"{LABEL_PREFIX}.pin."
    return {**stack.versions(), **{k[len(prefix):]: v for k, v in labels.items() if k.startswith(prefix)}}


def probe_request(pins: Mapping[str, str], stack: stacks.Stack, patches: list[Patch], launch_argv: list[str],
                  kernels: bool = True, *,
                  cuda_arch: str = "", aot: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "cuda_arch": cuda_arch,
        "aot": aot or [],
        "aot_builder": AOT_BUILDER,
        "distributions": sorted(expected_versions(pins, stack)),
        "tools": ["nvcc", "ptxas", "cuobjdump"],
        "files": sorted({target for patch in patches for target in patch.added_blocks}),
        "kernels": {lib: list(globs) for lib, globs in stack.verify.kernels.items()} if kernels else {},
        "server_argv": server_args_after_module(launch_argv),
        **stack.verify.request(),
    }


def parse_probe_output(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(PROBE_MARK):
            facts: dict[str, Any] = json.loads(line[len(PROBE_MARK):])
            return facts
    raise VerifyError("the probe printed no result; its output ended with:\n" + "\n".join(output.splitlines()[-20:]))


def run_probe(client: docker.DockerClient, tag: str, request: dict[str, Any]) -> dict[str, Any]:
    """Run probe.py in a throwaway container with no network; always removes the container."""
    source = (Path(__file__).parent / "probe.py").read_text(encoding="utf-8")
    container = client.containers.create(tag, command=["python3", "-c", source, json.dumps(request)],
                                         network_disabled=True, labels={f"{LABEL_PREFIX}.probe": "1"})
    try:
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT_S)
        output = container.logs(stdout=True, stderr=False).decode(errors="replace")
        if status.get("StatusCode") != 0:
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
            raise VerifyError(f"the probe exited {status.get('StatusCode')}:\n" + "\n".join(stderr.splitlines()[-20:]))
        return parse_probe_output(output)
    finally:
        container.remove(force=True)


def verify(tag: str, launch_argv: list[str], engine_url: str | None = None, *, pins: Mapping[str, str] | None = None,
           arch: str = TARGET_ARCH, folder: Path | None = None, kernels: bool = True,
           aot: AotPlan | None = None) -> VerifyReport:
    """Check the image ``tag`` against its pins (by default those recorded in its labels), the
    patches of its stack (the one its labels name), the target arch and a server launch command line; its
    toolchain (nvcc compiles for the GPUs' arch) and the FlashInfer modules built ahead of time
    (``aot``, the host's plan, else those its labels record).

    ``kernels=False`` skips the cuobjdump scan of the libraries (the slow part) for a quick check of the rest."""
    client = docker_client(engine_url)
    try:
        try:
            labels = client.images.get(tag).labels or {}
        except ImageNotFound:
            raise VerifyError(f"image {tag} is not on the engine") from None
        stack = stack_from_labels(labels, folder)
        expected = {**stack.versions(), **pins} if pins else pins_from_labels(labels, stack)
        patches = load_patches(stack)
        cuda_arch = aot.arch.cuda_arch if aot else labels.get(f"{LABEL_PREFIX}.aot.arch", DEFAULT_CUDA_ARCH)
        modules = [m.as_json() for m in aot.modules] if aot else json.loads(labels.get(f"{LABEL_PREFIX}.aot.modules", "[]"))
        request = probe_request(expected, stack, patches, launch_argv, kernels, cuda_arch=cuda_arch, aot=modules)
        facts = run_probe(client, tag, request)
    except DockerException as exc:
        raise VerifyError(f"verifying {tag}: {exc}") from None
    finally:
        client.close()
    return VerifyReport(tag, judge(facts, expected, stack, patches, arch, tool_cuda=labels.get(f"{LABEL_PREFIX}.toolchain.cuda"),
                                   cuda_arch=cuda_arch, aot=modules))
