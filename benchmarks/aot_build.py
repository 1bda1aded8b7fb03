#!/usr/bin/env python3
"""Time FlashInfer's ahead-of-time build here, and project the full module list per core count (issue 18).

Measured: the lab's toolchain variant of the image (CUDA 13.0 from PyPI; built first if missing,
as in tests/image/test_image_aot.py) runs the image build's own step (flashinfer_aot.py) for the
small module of the profile (batch MLA, 3 sources) in a throwaway container, with its wall time and
the compilers' CPU time. FlashInfer's generators, in the image, give each module's source count.

Projected, and said to be a projection: every module of the profile's list (and of the cutlass FP4
GEMM variant), per core count. A module's sources compile in parallel (ninja, MAX_JOBS = cores) and
the modules one after another (one build step each), so a module's wall time is its CPU time over
min(cores, sources), and never less than its slowest source. CPU time per source: the measured one for the attention and quantization
modules; for fused_moe_120 (89 sources) one source of each class compiled here with its own ninja
file, weighted by the class sizes (its 6 C++ sources are left out: host code, small); for fp4_gemm_cutlass_sm120 a measurement of it for 12.0a here (FIELD-NOTES s8:
128 s on 2 cores, 3 sources). Real builds differ by compiler (12.8 vs 13.0) and source; the projection says
how long to plan for, not what a build will take.

    python benchmarks/aot_build.py            # JSON on stdout
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import docker
import yaml
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpunode import plan, profiles  # noqa: E402
from gpunode.hostfile import load  # noqa: E402
from gpunode.image import build  # noqa: E402
from gpunode.image.aot import modules_json, profile_modules  # noqa: E402

SMALL = "batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_head_dim_kpe_64_profiler_False"
CUTLASS_CPU_S_PER_SOURCE = 128.0 * 2 / 3  # FIELD-NOTES s8: fp4_gemm_cutlass_sm120, 12.0a, 128 s wall on 2 cores, 3 sources
# fused_moe_120's CUDA sources by class (first match wins); one of each is compiled here.
MOE_CLASSES = {"sm120 instantiations": "sm120", "moe gemm templates": "^moe_gemm_kernels_",
               "sm80/sm90 instantiations": "_sm(80|90)_", "the rest": ""}
CORES = (2, 8, 16, 32, 64, 128)

# Runs in the image: the build step for the modules given, timed, then each module's source count.
TIMED = """
import json, os, resource, subprocess, sys, time
entries = json.loads(sys.argv[1])
started = time.monotonic()
subprocess.run([sys.executable, "/opt/gpunode/flashinfer_aot.py", json.dumps(entries)], check=True)
wall = time.monotonic() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print("GPUNODE-AOT " + json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime}))
"""
# Runs in the image: compiles one source of each class of a module's CUDA sources (ninja targets of
# FlashInfer's own build file), timed one by one: the CPU time per source, by class, of a module too
# long to build here. The classes differ by orders of magnitude: an sm90 CUTLASS instantiation
# compiles to almost nothing for 12.0a (its kernels are guarded by arch), an sm120 one is the bulk.
SAMPLE = """
import glob, json, os, re, resource, runpy, subprocess, sys, sysconfig, time
e, classes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
# The stand-in toolchain has no cuBLAS headers (a 420 MB wheel); the MoE sources include cublasLt.h.
# This throwaway container borrows torch's cuBLAS 12.8 headers, which only declare the API.
for header in glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/cublas/include/*.h"):
    target = os.path.join(os.environ["CUDA_HOME"], "include", os.path.basename(header))
    if not os.path.exists(target):
        os.symlink(header, target)
spec = runpy.run_path("/opt/gpunode/flashinfer_aot.py")["spec_of"](e)
spec.write_ninja()
objects = [o for o in spec.get_object_paths() if o.name.endswith(".cuda.o")]
out = {}
for name, pattern in classes.items():
    members = [o for o in objects if re.search(pattern, o.name)] if pattern else objects
    members = [o for o in members if not any(o in v["_members"] for v in out.values())]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), str(members[0])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("ninja failed: " + "\\n".join(l for l in done.stdout.splitlines() if "error" in l)[:2000])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out[name] = {"_members": members, "count": len(members), "sampled": members[0].name,
                 "wall_s": round(time.monotonic() - started, 1),
                 "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)}
for v in out.values():
    del v["_members"]
print("GPUNODE-SAMPLE " + json.dumps(out))
"""
SOURCES = """
import json, runpy, sys
spec_of = runpy.run_path("/opt/gpunode/flashinfer_aot.py")["spec_of"]
print("GPUNODE-SOURCES " + json.dumps({e["name"]: len(spec_of(e).sources) for e in json.loads(sys.argv[1])}))
"""


def marked(output: bytes, mark: str) -> dict:  # type: ignore[type-arg]
    line = next(line for line in output.decode().splitlines() if line.startswith(mark))
    return json.loads(line[len(mark):])  # type: ignore[no-any-return]


def lab_variant() -> object:
    data = yaml.safe_load((ROOT / "inventory" / "lab" / "host.yml").read_text())
    data["hosts"][0]["image"].update(toolchain="pypi-cuda-13.0", flashinfer_aot=[SMALL])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host.yml"
        path.write_text(yaml.safe_dump(data))
        return load(path).hosts[0]


def main() -> int:
    host = lab_variant()
    client = docker.from_env(timeout=3600)
    built = build(host.image, None, Console(stderr=True), aot=plan.aot_plan(host))  # type: ignore[attr-defined]
    env = {"FLASHINFER_CUDA_ARCH_LIST": "12.0a", "FLASHINFER_WORKSPACE_BASE": "/tmp/fi", "MAX_JOBS": str(os.cpu_count())}
    small = [m for m in plan.aot_plan(host).wanted if m.name == SMALL]  # type: ignore[attr-defined]
    measured = marked(client.containers.run(built.tag, ["python3", "-c", TIMED, modules_json(small)], remove=True,
                                            network_disabled=True, environment=env), "GPUNODE-AOT ")
    full = profile_modules(profiles.load("glm5-nvfp4-sm120"), {"--fp4-gemm-backend": "flashinfer_cutlass"})
    sources = marked(client.containers.run(built.tag, ["python3", "-c", SOURCES, modules_json(full)], remove=True,
                                           network_disabled=True, environment=env), "GPUNODE-SOURCES ")
    per_source = measured["cpu_s"] / sources[SMALL]
    moe = next(m for m in full if m.name == "fused_moe_120")
    sample = marked(client.containers.run(built.tag, ["python3", "-c", SAMPLE, json.dumps(moe.as_json()),
                                                      json.dumps(MOE_CLASSES)], remove=True, network_disabled=True,
                                          environment=env), "GPUNODE-SAMPLE ")
    moe_cpu = sum(c["count"] * c["cpu_s"] for c in sample.values())
    moe_sources = sum(c["count"] for c in sample.values())
    rates = {"fused_moe_120": moe_cpu / moe_sources, "fp4_gemm_cutlass_sm120": CUTLASS_CPU_S_PER_SOURCE}
    # A module is never faster than its slowest source, whatever the core count.
    longest = {"fused_moe_120": max(c["cpu_s"] for c in sample.values()), "fp4_gemm_cutlass_sm120": CUTLASS_CPU_S_PER_SOURCE}
    modules = []
    for module in full:
        rate = rates.get(module.name, per_source)
        cpu = rate * sources[module.name]
        floor = longest.get(module.name, per_source)
        modules.append({"name": module.name, "group": module.group, "sources": sources[module.name],
                        "cpu_s": round(cpu), "wall_s_by_cores": {c: round(max(cpu / min(c, sources[module.name]), floor))
                                                                 for c in CORES}})
    seeds = {m.name for m in profile_modules(profiles.load("glm5-nvfp4-sm120"), {})}
    report = {
        "measured": {"module": SMALL, "sources": sources[SMALL], "cores_here": os.cpu_count(),
                     "wall_s": round(measured["wall_s"], 1), "cpu_s": round(measured["cpu_s"], 1),
                     "toolchain": "CUDA 13.0 from PyPI (the lab's stand-in)", "image": built.tag,
                     "fused_moe_120_sample_by_class": sample},
        "projection": {
            "note": "PROJECTION, not a measurement: CPU time per source from the measured module (attention, "
                    "quantization), from a sample of fused_moe_120's sources compiled here, and from FIELD-NOTES "
                    "s8's fp4_gemm_cutlass_sm120 reading; modules build one after another, sources in parallel",
            "modules": modules,
            "seeds_profile_wall_s_by_cores": {c: sum(m["wall_s_by_cores"][c] for m in modules if m["name"] in seeds)
                                              for c in CORES},
            "cutlass_fp4_gemm_profile_wall_s_by_cores": {c: sum(m["wall_s_by_cores"][c] for m in modules)
                                                         for c in CORES},
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
