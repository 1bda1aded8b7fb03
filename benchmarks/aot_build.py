#!/usr/bin/env python3
"""Time FlashInfer's ahead-of-time build here, per stack, and project the full module list per core count.

Measured, in a lab image of the stack (built first if missing, as the image tests do): the image
build's own step (flashinfer_aot.py) for each small module of the stack's profile (up to
FULL_BUILD_SOURCES sources), in a throwaway container, wall time and the compilers' CPU time; for
the large ones, one source of each class compiled with FlashInfer's own ninja file, weighted by the
class sizes (the C++ host sources are left out: small). FlashInfer's generators in the image give
each module's source count.

    seeds' stack (sglang-0.5.9-cu128): the lab's toolchain variant (CUDA 13.0 from PyPI, a stand-in
      for CUDA 12.8); fp4_gemm_cutlass_sm120 from FIELD-NOTES s8's reading (128 s on 2 cores, 3 sources)
    current stack (sglang-0.5.23-cu130): its own toolchain (torch's CUDA 13.0.3 wheels)

Projected, and said to be a projection: every module of the profile's list, per core count. A
module's sources compile in parallel (ninja, MAX_JOBS = cores) and the modules one after another
(one build step each), so a module's wall time is its CPU time over min(cores, sources), and never
less than its slowest source. The projection says how long to plan for, not what a build will take.

    python benchmarks/aot_build.py [--stack sglang-0.5.23-cu130]     # JSON on stdout
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

from gpunode import derive  # noqa: E402
from gpunode.catalogue import profiles, stacks  # noqa: E402
from gpunode.derive.plan import load  # noqa: E402
from gpunode.stages.image import build  # noqa: E402
from gpunode.catalogue.aot import modules_json, profile_modules  # noqa: E402
from gpunode.derive.imagecontext import AOT_BUILDER, AOT_SCRIPT, images_dir  # noqa: E402

SMALL = "batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_head_dim_kpe_64_profiler_False"
CUTLASS_CPU_S_PER_SOURCE = 128.0 * 2 / 3  # FIELD-NOTES s8: fp4_gemm_cutlass_sm120, 12.0a, 128 s wall on 2 cores, 3 sources
FULL_BUILD_SOURCES = 13  # modules up to this many sources are built whole; larger ones sampled by class
# A large module's CUDA sources by class (first match wins); one of each is compiled here.
CLASSES = {"fused_moe_120": {"sm120 instantiations": "_sm120_", "moe gemm templates": "moe_gemm_kernels_",
                             "sm80/sm90 instantiations": "_sm(80|90)_", "the rest": ""},
           "fp4_gemm_cutlass_sm120": {"tile instantiations": "fp4_gemm_cutlass_(half|_+nv_bfloat16)_", "the rest": ""}}
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
ninja = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)]
# The targets as the build file names them (FlashInfer 0.7's differ from get_object_paths()).
listed = subprocess.run(ninja + ["-t", "targets", "all"], capture_output=True, text=True, check=True).stdout
objects = [line.split(":")[0] for line in listed.splitlines() if line.split(":")[0].endswith(".cuda.o")]
out = {}
for name, pattern in classes.items():
    members = [o for o in objects if re.search(pattern, os.path.basename(o))] if pattern else objects
    members = [o for o in members if not any(o in v["_members"] for v in out.values())]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(ninja + [members[0]], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stdout + done.stderr).splitlines()
        sys.exit("ninja failed: " + "\\n".join(l for l in said if "error" in l.lower())[:2000])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out[name] = {"_members": members, "count": len(members), "sampled": os.path.basename(members[0]),
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


def lab_host(stack: str) -> object:
    """The lab host file on ``stack``: the seeds' with the lab's stand-in toolchain and its small
    module, the current stack with its own toolchain and no module (each is timed on its own here)."""
    data = yaml.safe_load((ROOT / "inventory" / "lab" / "host.yml").read_text())
    image = data["hosts"][0]["image"]
    if stack == stacks.DEFAULT:
        image.update(toolchain="pypi-cuda-13.0", flashinfer_aot=[SMALL])
    else:
        image.update(stack=stack, flashinfer_aot="none")
        image.pop("base", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host.yml"
        path.write_text(yaml.safe_dump(data))
        return load(path).hosts[0]


def main() -> int:
    stack_name = sys.argv[sys.argv.index("--stack") + 1] if "--stack" in sys.argv else stacks.DEFAULT
    host = lab_host(stack_name)
    stack = stacks.load(stack_name)
    profile = profiles.load(stack.profile)
    client = docker.from_env(timeout=7200)
    built = build(host.image, None, Console(stderr=True), aot=derive.aot_plan(host))  # type: ignore[attr-defined]
    arch = derive.aot_plan(host).arch.cuda_arch  # type: ignore[attr-defined]
    env = {"FLASHINFER_CUDA_ARCH_LIST": arch, "FLASHINFER_WORKSPACE_BASE": "/tmp/fi", "MAX_JOBS": str(os.cpu_count())}

    def run(script: str, *args: str, mark: str) -> dict:  # type: ignore[type-arg]
        # The image's own builder, mounted: an image built without modules does not carry it.
        builder = {str(images_dir() / AOT_SCRIPT): {"bind": AOT_BUILDER, "mode": "ro"}}
        return marked(client.containers.run(built.tag, ["python3", "-c", script, *args], remove=True,
                                            network_disabled=True, environment=env, volumes=builder), mark)

    overrides = {"--fp4-gemm-backend": "flashinfer_cutlass"} if stack_name == stacks.DEFAULT else {}
    full = profile_modules(stack, profile, overrides)
    sources = run(SOURCES, modules_json(full), mark="GPUNODE-SOURCES ")
    measured: dict[str, dict] = {}  # type: ignore[type-arg]
    modules = []
    for module in full:
        count = sources[module.name]
        if module.name == "fp4_gemm_cutlass_sm120" and stack_name == stacks.DEFAULT:
            cpu, floor, how = CUTLASS_CPU_S_PER_SOURCE * count, CUTLASS_CPU_S_PER_SOURCE, "FIELD-NOTES s8"
        elif count <= FULL_BUILD_SOURCES or module.name not in CLASSES:
            timed = run(TIMED, modules_json([module]), mark="GPUNODE-AOT ")
            measured[module.name] = {"sources": count, "wall_s": round(timed["wall_s"], 1), "cpu_s": round(timed["cpu_s"], 1)}
            cpu, floor, how = timed["cpu_s"], timed["cpu_s"] / count, "built whole here"
        else:
            sample = run(SAMPLE, json.dumps(module.as_json()), json.dumps(CLASSES[module.name]), mark="GPUNODE-SAMPLE ")
            measured[module.name] = {"sources": count, "sample_by_class": sample}
            cpu = sum(c["count"] * c["cpu_s"] for c in sample.values())  # the CUDA sources; host C++ is small
            floor, how = max(c["cpu_s"] for c in sample.values()), "one source per class compiled here"
        modules.append({"name": module.name, "group": module.group, "sources": count, "cpu_s": round(cpu), "from": how,
                        "wall_s_by_cores": {c: round(max(cpu / min(c, count), floor)) for c in CORES}})
    profile_set = {m.name for m in profile_modules(stack, profile, {})}
    report = {
        "stack": stack_name, "arch": arch, "cores_here": os.cpu_count(), "image": built.tag,
        "measured": measured,
        "projection": {
            "note": "PROJECTION, not a measurement: modules build one after another, each one's sources in "
                    "parallel; CPU time per source from the modules built whole here and from the sampled classes",
            "modules": modules,
            "profile_wall_s_by_cores": {c: sum(m["wall_s_by_cores"][c] for m in modules if m["name"] in profile_set)
                                        for c in CORES},
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
