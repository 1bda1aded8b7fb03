"""Runs INSIDE the server image (``python3 -c``): gathers facts, judges nothing, prints one JSON object.

Standard library only, plus the image's own packages. Input: one JSON argument
``{"distributions": [...], "files": [...], "kernels": {lib: [glob, ...]}, "server_argv": [...],
"toolchain_users": {lib: "module:function"}, "entry_points": [...], "symbols": {...}, "stack_files": [...]}``.
Everything that fails is reported as text, never raised: verify decides what a fact means.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

SITE = sysconfig.get_paths()["purelib"]
ARCH_TOKEN = re.compile(r"\b(sm_\d+[af]?)\b")
# Where the CUDA tools can come from inside the image, first match wins.
TOOL_DIRS = ("{cuda_home}/bin", "{site}/nvidia/cuda_nvcc/bin", "{site}/triton/backends/nvidia/bin")


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def versions(distributions: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def torch_facts() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is a fact to report
        return {"error": error_text(exc)}
    return {"version": torch.__version__, "cuda": torch.version.cuda}


def find_tool(name: str) -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for folder in TOOL_DIRS:
        path = os.path.join(folder.format(cuda_home=cuda_home, site=SITE), name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def tool_facts(names: list[str]) -> dict[str, dict[str, str | None]]:
    facts: dict[str, dict[str, str | None]] = {}
    for name in names:
        path = find_tool(name)
        text = None
        if path:
            result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            text = (result.stdout + result.stderr).strip()
        facts[name] = {"path": path, "version": text}
    return facts


def file_texts(paths: list[str]) -> dict[str, str | None]:
    texts: dict[str, str | None] = {}
    for rel in paths:
        try:
            with open(os.path.join(SITE, rel), encoding="utf-8") as handle:
                texts[rel] = handle.read()
        except OSError:
            texts[rel] = None
    return texts


def cuobjdump_archs(cuobjdump: str, path: str, listing: str) -> tuple[list[str], str | None]:
    """Arch tokens of ``cuobjdump --list-elf|--list-ptx``; a file without device code gives []."""
    result = subprocess.run([cuobjdump, f"--list-{listing}", path], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        if "does not contain device code" in message:
            return [], None
        return [], message[:300]
    return sorted(set(ARCH_TOKEN.findall(result.stdout))), None


EM_CUDA = 190


def cubin_arch(path: str) -> str | None:
    """The SM of a standalone cubin, from its ELF header (thousands of files: no process each).

    CUDA ELF ABI version 8 and later keep the SM in bits 8-15 of e_flags, older ones in bits 0-7.
    """
    with open(path, "rb") as handle:
        header = handle.read(52)
    if len(header) < 52 or header[:4] != b"\x7fELF" or int.from_bytes(header[18:20], "little") != EM_CUDA:
        return None
    flags = int.from_bytes(header[48:52], "little")
    sm = (flags >> 8) & 0xFF if header[8] >= 8 else flags & 0xFF
    return f"sm_{sm}"


def binary_facts(cuobjdump: str, path: str) -> tuple[dict[str, list[str]], list[str]]:
    if path.endswith(".cubin"):
        arch = cubin_arch(path)
        return ({"elf": [arch], "ptx": []} if arch else {"elf": [], "ptx": []}), []
    found: dict[str, list[str]] = {}
    errors = []
    for listing in ("elf", "ptx"):
        archs, problem = cuobjdump_archs(cuobjdump, path, listing)
        found[listing] = archs
        if problem:
            errors.append(problem)
    return found, errors


def kernel_facts(cuobjdump: str | None, libraries: dict[str, list[str]]) -> dict[str, Any]:
    """Per library: how many files matched, and for each file with device code its ELF (SASS) and
    PTX archs, by path relative to site-packages."""
    facts: dict[str, Any] = {}
    for library, patterns in libraries.items():
        files = sorted({p for pattern in patterns for p in glob.glob(os.path.join(SITE, pattern), recursive=True)
                        if os.path.isfile(p)})
        entry: dict[str, Any] = {"files": len(files), "binaries": {}, "errors": []}
        if cuobjdump is None:
            entry["errors"].append("no cuobjdump in the image")
            files = []
        for path in files:
            found, errors = binary_facts(str(cuobjdump), path)
            rel = os.path.relpath(path, SITE)
            entry["errors"].extend(f"{rel}: {e}" for e in errors)
            if found["elf"] or found["ptx"]:
                entry["binaries"][rel] = found
        facts[library] = entry
    return facts


def parse_server_argv(argv: list[str]) -> dict[str, Any]:
    """Parse with sglang's own parser, as ``prepare_server_args`` does, without building ServerArgs
    (its __post_init__ needs a GPU)."""
    try:
        import argparse

        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": "cannot import sglang.srt.server_args: " + error_text(exc)}
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return {"ok": False, "error": lines[-1] if lines else "rejected"}
    return {"ok": True, "values": {k: v for k, v in vars(namespace).items() if isinstance(v, (str, int, float, bool))}}


def model_support() -> dict[str, Any]:
    """transformers must know GLM-5's config type; sglang must list its model class."""
    facts: dict[str, Any] = {}
    try:
        from transformers import CONFIG_MAPPING

        facts["transformers_glm_moe_dsa"] = "glm_moe_dsa" in CONFIG_MAPPING
    except Exception as exc:  # noqa: BLE001
        facts["transformers_glm_moe_dsa"] = False
        facts["transformers_error"] = error_text(exc)
    try:
        import sglang.srt.configs.model_config as model_config

        with open(model_config.__file__, encoding="utf-8") as handle:
            facts["sglang_glm5_class"] = "GlmMoeDsaForCausalLM" in handle.read()
    except Exception as exc:  # noqa: BLE001
        facts["sglang_glm5_class"] = False
        facts["sglang_error"] = error_text(exc)
    return facts


NVCC_TEST = "__global__ void gpunode_probe(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def nvcc_compile(nvcc: str | None, cuda_arch: str) -> dict[str, Any]:
    """Compile a trivial kernel for ``cuda_arch`` (``12.0a``) to a cubin and read its SASS arch:
    nvcc, cicc, ptxas and the headers all work, for that target."""
    if not cuda_arch:
        return {}
    if nvcc is None:
        return {"ok": False, "error": "no nvcc"}
    code = cuda_arch.replace(".", "")
    with tempfile.TemporaryDirectory() as tmp:
        source, cubin = os.path.join(tmp, "probe.cu"), os.path.join(tmp, "probe.cubin")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(NVCC_TEST)
        command = [nvcc, f"-gencode=arch=compute_{code},code=sm_{code}", "-cubin", "-o", cubin, source]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            return {"ok": False, "command": " ".join(command), "error": (result.stderr or result.stdout).strip()[-1500:]}
        arch = cubin_arch(cubin)
        return {"ok": True, "command": " ".join(command), "sass": [arch] if arch else []}


def aot_facts(cuobjdump: str | None, modules: list[dict[str, Any]], cuda_arch: str, builder: str) -> dict[str, Any]:
    """Each module through FlashInfer's own lookup, with JIT disabled as a launch would have it:
    the spec from FlashInfer's generator (through the image's own builder, ``builder``), the library
    FlashInfer would load, its SASS archs. With no GPU here, FLASHINFER_CUDA_ARCH_LIST names the
    target (FlashInfer reads it at import)."""
    if not modules:
        return {}
    try:
        spec_of = runpy.run_path(builder)["spec_of"]
    except OSError as exc:
        missing = f"no ahead-of-time builder in the image ({error_text(exc)}): it was built without FlashInfer modules"
        return {entry["name"]: {"error": missing} for entry in modules}
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = cuda_arch
    os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp()
    facts: dict[str, Any] = {}
    for entry in modules:
        fact: dict[str, Any] = {}
        facts[entry["name"]] = fact
        try:
            spec = spec_of(entry)
            fact.update(spec_name=spec.name, aot_path=str(spec.aot_path), is_aot=bool(spec.is_aot),
                        library=str(spec.get_library_path()))
        except Exception as exc:  # noqa: BLE001
            fact["error"] = error_text(exc)
            continue
        if fact["is_aot"] and cuobjdump:
            found, errors = binary_facts(cuobjdump, fact["aot_path"])
            fact.update(sass=found["elf"], ptx=found["ptx"], size=os.path.getsize(fact["aot_path"]),
                        errors=errors)
    return facts


def toolchain_user_facts(users: dict[str, str]) -> dict[str, Any]:
    """Each library's own lookup of the CUDA toolchain (a CUDA home, or nvcc itself), and the nvcc
    it leads to with its version."""
    facts: dict[str, Any] = {}
    for library, spec in users.items():
        module, function = spec.split(":")
        try:
            found = str(getattr(importlib.import_module(module), function)())
        except Exception as exc:  # noqa: BLE001 - a lookup that fails is the fact
            facts[library] = {"error": error_text(exc)}
            continue
        nvcc = os.path.join(found, "bin", "nvcc") if os.path.isdir(found) else found
        fact: dict[str, Any] = {"found": found, "nvcc": nvcc, "version": None}
        if os.access(nvcc, os.X_OK):
            result = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
            fact["version"] = (result.stdout + result.stderr).strip()
        facts[library] = fact
    return facts


def entry_point_facts(names: list[str]) -> dict[str, str | None]:
    """``module:attribute`` -> None when present, else why not."""
    facts: dict[str, str | None] = {}
    for name in names:
        module, attribute = name.split(":")
        try:
            facts[name] = None if callable(getattr(importlib.import_module(module), attribute, None)) else "absent"
        except Exception as exc:  # noqa: BLE001
            facts[name] = error_text(exc)
    return facts


def symbol_facts(symbols: dict[str, list[str]]) -> dict[str, Any]:
    """For each binary under site-packages, which of the names its bytes hold (mangled names contain them)."""
    facts: dict[str, Any] = {}
    for rel, names in symbols.items():
        try:
            with open(os.path.join(SITE, rel), "rb") as handle:
                data = handle.read()
        except OSError as exc:
            facts[rel] = {"error": error_text(exc)}
            continue
        facts[rel] = {"present": [n for n in names if n.encode() in data], "missing": [n for n in names if n.encode() not in data]}
    return facts


def main(request: dict[str, Any]) -> dict[str, Any]:
    tools = tool_facts(request.get("tools", ["nvcc", "ptxas", "cuobjdump"]))
    cuobjdump = tools.get("cuobjdump", {}).get("path")
    return {
        "nvcc_compile": nvcc_compile(tools.get("nvcc", {}).get("path"), request.get("cuda_arch", "")),
        "aot": aot_facts(cuobjdump, request.get("aot", []), request.get("cuda_arch", ""), request.get("aot_builder", "")),
        "python": sys.version.split()[0],
        "site": SITE,
        "versions": versions(request.get("distributions", [])),
        "torch": torch_facts(),
        "tools": tools,
        "files": file_texts(request.get("files", [])),
        "kernels": kernel_facts(cuobjdump, request.get("kernels", {})),
        "server_argv": parse_server_argv(request.get("server_argv", [])),
        "model": model_support(),
        "toolchain_users": toolchain_user_facts(request.get("toolchain_users", {})),
        "entry_points": entry_point_facts(request.get("entry_points", [])),
        "symbols": symbol_facts(request.get("symbols", {})),
        "stack_files": {rel: os.path.isfile(os.path.join(SITE, rel)) for rel in request.get("stack_files", [])},
    }


if __name__ == "__main__":
    print("GPUNODE-PROBE " + json.dumps(main(json.loads(sys.argv[1]))))
