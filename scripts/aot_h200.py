#!/usr/bin/env python3
"""Build one FlashInfer module ahead of time on a GPU machine and prove FlashInfer loads it with JIT off.

Runs on the device machine (an H200: sm_90a), self-contained. FlashInfer 0.6.3 and apache-tvm-ffi
must be importable (carried as wheels and installed with ``pip install --no-index --target``).
The module is ``page`` (flashinfer/jit/page.py gen_page_module: page.cu + its binding, no cuBLAS or
cuRAND headers needed), whose API is ``flashinfer.page.append_paged_kv_cache``.

Phases, each in a fresh Python process with its own environment:

1. ``negative``: FLASHINFER_DISABLE_JIT=1 before anything is installed: the API must raise
   MissingJITCacheError (flashinfer/jit/core.py JitSpec.build).
2. ``build``: FLASHINFER_CUDA_ARCH_LIST=9.0a, a private FLASHINFER_WORKSPACE_BASE, JIT on:
   ``gen_page_module().build()`` compiles into the JIT cache, then the library is copied to
   ``spec.aot_path`` (``<flashinfer>/data/aot/page/page.so``), where JitSpec.build_and_load looks first.
3. ``check``: FLASHINFER_DISABLE_JIT=1, another empty workspace, no arch list (FlashInfer reads the
   GPU): resolves the spec's path through FlashInfer (``get_library_path``, ``is_aot``), calls
   ``append_paged_kv_cache`` on real CUDA tensors, compares the whole cache with a plain PyTorch
   scatter, and reads /proc/self/maps for the page.so actually mapped.

Prints one JSON object (and writes it to ``--out DIR``/aot_h200.json when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARCH = "9.0a"
MODULE = "page"


# ---------------------------------------------------------------- phases (child processes)

def phase_negative() -> dict[str, Any]:
    import torch
    import flashinfer
    from flashinfer.jit.core import MissingJITCacheError

    k = torch.zeros(1, 1, 64, dtype=torch.bfloat16, device="cuda")
    cache = torch.zeros(1, 2, 16, 1, 64, dtype=torch.bfloat16, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    try:
        flashinfer.page.append_paged_kv_cache(
            k, k, torch.zeros(1, **i32), torch.zeros(1, **i32), cache,
            torch.zeros(1, **i32), torch.tensor([0, 1], **i32), torch.ones(1, **i32))
    except MissingJITCacheError as e:
        return {"raised": "MissingJITCacheError", "message": str(e)}
    except Exception as e:  # noqa: BLE001 - recorded, judged by the parent
        return {"raised": type(e).__name__, "message": str(e)[:500]}
    return {"raised": None}


def phase_build() -> dict[str, Any]:
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.cpp_ext import get_cuda_path, get_cuda_version
    from flashinfer.jit.page import gen_page_module

    spec = gen_page_module()
    started = time.monotonic()
    spec.build(verbose=False)
    build_s = time.monotonic() - started
    spec.aot_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, spec.aot_path)
    ninja = spec.ninja_path.read_text()
    return {
        "name": spec.name,
        "build_s": round(build_s, 2),
        "jit_library_path": str(spec.jit_library_path),
        "aot_path": str(spec.aot_path),
        "aot_dir": str(jit_env.FLASHINFER_AOT_DIR),
        "so_bytes": spec.aot_path.stat().st_size,
        "cuda_home": get_cuda_path(),
        "nvcc_release": str(get_cuda_version()),
        "gencode": sorted(set(re.findall(r"-gencode=\S+", ninja))),
        "sources": [Path(s).name for s in spec.sources],
    }


def phase_check() -> dict[str, Any]:
    import torch
    import flashinfer
    from flashinfer.jit.core import current_compilation_context
    from flashinfer.jit.page import gen_page_module

    spec = gen_page_module()
    lookup = {
        "get_library_path": str(spec.get_library_path()),
        "is_aot": spec.is_aot,
        "jit_library_path_exists": spec.jit_library_path.exists(),
        "target_archs_from_gpu": sorted(f"{a}.{b}" for a, b in current_compilation_context.TARGET_CUDA_ARCHS),
    }

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    heads, dim, page_size, max_pages = 8, 128, 16, 64
    existing = [3, 0, 17, 40]          # tokens already in each request's cache
    appended = [45, 8, 25, 22]         # tokens appended now (ragged)
    total = [e + a for e, a in zip(existing, appended)]
    pages = [(t + page_size - 1) // page_size for t in total]
    perm = torch.randperm(max_pages)[: sum(pages)].to(torch.int32)
    kv_indices = perm.to(dev)
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    kv_last_page_len = torch.tensor([t - page_size * (p - 1) for t, p in zip(total, pages)], dtype=torch.int32, device=dev)
    batch_indices = torch.cat([torch.full((a,), b, dtype=torch.int32) for b, a in enumerate(appended)]).to(dev)
    positions = torch.cat([torch.arange(e, e + a, dtype=torch.int32) for e, a in zip(existing, appended)]).to(dev)
    nnz = sum(appended)
    k = torch.randn(nnz, heads, dim, dtype=dt, device=dev)
    v = torch.randn(nnz, heads, dim, dtype=dt, device=dev)
    cache = torch.randn(max_pages, 2, page_size, heads, dim, dtype=dt, device=dev)  # NHD, 5-D
    ref = cache.clone()

    # plain PyTorch reference: token at position p of request b goes to
    # page kv_indices[kv_indptr[b] + p // page_size], slot p % page_size
    page_of = kv_indices[kv_indptr[batch_indices.long()].long() + (positions // page_size).long()].long()
    slot = (positions % page_size).long()
    ref[page_of, 0, slot] = k
    ref[page_of, 1, slot] = v

    started = time.monotonic()
    flashinfer.page.append_paged_kv_cache(
        k, v, batch_indices, positions, cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD")
    torch.cuda.synchronize()
    call_s = time.monotonic() - started
    err = (cache.float() - ref.float()).abs().max().item()

    maps = Path("/proc/self/maps").read_text().splitlines()
    mapped = sorted({line.split()[-1] for line in maps if line.endswith(f"/{MODULE}.so")})
    return {
        "lookup": lookup,
        "loaded_so": mapped,
        "shape": {"nnz": nnz, "heads": heads, "head_dim": dim, "page_size": page_size,
                  "max_pages": max_pages, "dtype": str(dt), "layout": "NHD"},
        "first_call_s": round(call_s, 3),
        "max_abs_err": err,
        "tokens_written": int(nnz * 2),
    }


PHASES = {"negative": phase_negative, "build": phase_build, "check": phase_check}


# ---------------------------------------------------------------- orchestration (parent)

def run_phase(name: str, env: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--phase", name], env=env,
                          capture_output=True, text=True, timeout=500)
    wall = round(time.monotonic() - started, 2)
    result: dict[str, Any] = {"rc": proc.returncode, "wall_s": wall}
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and last:
        result.update(json.loads(last[-1]))
    else:
        result["stderr_tail"] = (proc.stderr or proc.stdout)[-3000:]
    return result


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    code = ("import json, torch, flashinfer, tvm_ffi;"
            "p = torch.cuda.get_device_properties(0);"
            "print(json.dumps({'torch': torch.__version__, 'torch_cuda': torch.version.cuda,"
            "'flashinfer': flashinfer.__version__, 'tvm_ffi': tvm_ffi.__version__,"
            "'flashinfer_path': flashinfer.__file__,"
            "'torch_dlpack_c_exchange_api': hasattr(torch.Tensor, '__dlpack_c_exchange_api__'),"
            "'gpu': p.name, 'capability': '%d.%d' % (p.major, p.minor)}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    out.update(json.loads(lines[-1]) if lines else {"error": proc.stderr[-1000:]})
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    out["driver"] = smi.stdout.strip() or smi.stderr.strip()
    nvcc = shutil.which("nvcc")
    out["nvcc"] = nvcc
    if nvcc:
        out["nvcc_version"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return out


def cuobjdump(so: str) -> dict[str, Any]:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {"error": "cuobjdump not found"}
    elf = subprocess.run([tool, "--list-elf", so], capture_output=True, text=True)
    ptx = subprocess.run([tool, "--list-ptx", so], capture_output=True, text=True)
    return {
        "tool": tool,
        "list_elf": elf.stdout.strip().splitlines(),
        "archs": sorted(set(re.findall(r"\.(sm_\w+)\.cubin", elf.stdout))),
        "list_ptx": (ptx.stdout.strip() or ptx.stderr.strip()).splitlines(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=sorted(PHASES))
    ap.add_argument("--out", type=Path, help="folder for aot_h200.json")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase]()), flush=True)
        return 0

    work = Path(tempfile.mkdtemp(prefix="aot_h200."))
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("FLASHINFER_")}
    # FlashInfer runs `ninja` by name: the one pip put beside this Python
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    report: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "module": MODULE, "arch_list": ARCH, "versions": versions()}

    report["negative"] = run_phase("negative", {**base, "FLASHINFER_DISABLE_JIT": "1",
                                                "FLASHINFER_WORKSPACE_BASE": str(work / "ws-negative")})
    report["build"] = run_phase("build", {**base, "FLASHINFER_CUDA_ARCH_LIST": ARCH,
                                          "FLASHINFER_WORKSPACE_BASE": str(work / "ws-build"),
                                          "MAX_JOBS": str(os.cpu_count() or 2)})
    aot_path = report["build"].get("aot_path")
    report["cuobjdump"] = cuobjdump(aot_path) if aot_path else {"error": "no build"}
    report["check"] = run_phase("check", {**base, "FLASHINFER_DISABLE_JIT": "1",
                                          "FLASHINFER_WORKSPACE_BASE": str(work / "ws-check")})

    check = report["check"]
    conditions = {
        "negative_raised_missing_jit_cache": report["negative"].get("raised") == "MissingJITCacheError",
        "built": report["build"].get("rc") == 0,
        "cubin_is_sm_90a": report["cuobjdump"].get("archs") == ["sm_90a"],
        "lookup_is_aot_path": check.get("lookup", {}).get("is_aot") is True
        and check.get("lookup", {}).get("get_library_path") == aot_path,
        "loaded_aot_so": check.get("loaded_so") == [aot_path],
        "no_jit_build_in_check": check.get("lookup", {}).get("jit_library_path_exists") is False,
        "max_abs_err_zero": check.get("max_abs_err") == 0.0,
    }
    report["conditions"] = conditions
    report["pass"] = all(conditions.values())
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "aot_h200.json").write_text(text + "\n")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
