"""Record the NVML sampler (gpunode.bench.sampler) on a real GPU under known loads, for the fixture
tests/fixtures/bench/ and the numbers in the report. Needs a GPU, torch and nvidia-ml-py.

    PYTHONPATH=src python3 benchmarks/bench_sampler_gpu.py OUT_DIR [--e2e]

Phases, each marked on the samples' clock (``phases`` in the JSON):

- ``idle``: torch initialised, tensors allocated, nothing running (4 s);
- ``small_gemm_graph``: a CUDA graph of 256 back-to-back 256x256 BF16 matrix products replayed
  without pause (7 s): a kernel always running, few SMs busy - the seeds' "100 % busy at low power";
- ``large_gemm``: 8192x8192x8192 BF16 matrix products (12 s): tensor cores saturated;
- ``h2d_copy``: 256 MiB pinned host-to-device copies (3 s): PCIe RX traffic;
- ``idle_tail`` (2 s).

With ``--e2e`` it then runs ``gpunode.bench.command.bench`` end to end against the test stand-in
server (tests/fakes) with the real NVML sampler, while a child process keeps the GPU busy with large
products, and packs the results folder as e2e.tar.gz.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from gpunode.bench.sampler import NvmlSampler

LOAD_CHILD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
"""


def run_phase(name: str, seconds: float, step: Any, sampler: NvmlSampler, phases: list[dict[str, Any]],
              sync: Any) -> dict[str, Any]:
    t0 = sampler.now()
    began = time.monotonic()
    count = 0
    while time.monotonic() - began < seconds:
        step()
        count += 1
        sync()
    phase = {"name": name, "t0": round(t0, 3), "t1": round(sampler.now(), 3), "steps": count,
             "seconds": round(time.monotonic() - began, 3)}
    phases.append(phase)
    return phase


def record(out: Path) -> None:
    import torch

    torch.cuda.init()
    device = torch.device("cuda")
    small = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
    small_out = torch.empty_like(small)
    big_a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    big_b = torch.randn_like(big_a)
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    dev = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    # Capture the small-GEMM graph (after a warm-up on a side stream, as torch requires).
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            torch.matmul(small, small, out=small_out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graphed = 256
    with torch.cuda.graph(graph):
        for _ in range(graphed):
            torch.matmul(small, small, out=small_out)
    for _ in range(3):
        big_a @ big_b
    torch.cuda.synchronize()

    sampler = NvmlSampler(interval_s=0.1)
    phases: list[dict[str, Any]] = []
    sampler.start()
    try:
        time.sleep(4.0)
        phases.append({"name": "idle", "t0": 0.0, "t1": round(sampler.now(), 3), "steps": 0, "seconds": 4.0})

        def replay() -> None:
            for _ in range(20):
                graph.replay()

        small_phase = run_phase("small_gemm_graph", 7.0, replay, sampler, phases, torch.cuda.synchronize)

        def big() -> None:
            for _ in range(10):
                torch.matmul(big_a, big_b)

        big_phase = run_phase("large_gemm", 12.0, big, sampler, phases, torch.cuda.synchronize)

        def copy() -> None:
            for _ in range(8):
                dev.copy_(host, non_blocking=True)

        copy_phase = run_phase("h2d_copy", 3.0, copy, sampler, phases, torch.cuda.synchronize)
        tail0 = sampler.now()
        time.sleep(2.0)
        phases.append({"name": "idle_tail", "t0": round(tail0, 3), "t1": round(sampler.now(), 3), "steps": 0,
                       "seconds": 2.0})
    finally:
        samples = sampler.stop()
    small_flops = 2 * 256**3 * graphed * 20 * small_phase["steps"] / small_phase["seconds"] / 1e12
    big_flops = 2 * 8192**3 * 10 * big_phase["steps"] / big_phase["seconds"] / 1e12
    copy_gbps = 8 * host.numel() * copy_phase["steps"] / copy_phase["seconds"] / 1e9
    doc = {
        "what": "gpunode.bench.sampler.NvmlSampler at 0.1 s on one GPU under known loads (benchmarks/bench_sampler_gpu.py)",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__, "cuda_runtime": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
        "phases": phases,
        "load": {"small_gemm_graph_tflops": round(small_flops, 2), "large_gemm_tflops": round(big_flops, 1),
                 "h2d_copy_gbps": round(copy_gbps, 2)},
        "sample_set": samples.to_json(),
    }
    (out / "h200_sampler_load.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if k != "sample_set"}, indent=1))
    print("samples", len(samples.samples), "pcie", len(samples.pcie), "unsupported", samples.unsupported,
          "errors", samples.errors, "call_ms", samples.call_ms)


def e2e(out: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "tests"))
    from fakes import SHIM
    from fakes.process import fake_server, model_dir

    from gpunode.bench.command import bench
    from gpunode.stages.smoke.bench import LocalBenchRunner

    work = Path("/tmp/gpunode-bench-e2e")
    work.mkdir(exist_ok=True)
    runner = LocalBenchRunner(str(model_dir(work)), python=[sys.executable], extra_env={"PYTHONPATH": str(SHIM)})
    load = subprocess.Popen([sys.executable, "-c", LOAD_CHILD, "40"])
    try:
        time.sleep(8.0)  # the child's CUDA start and first products
        with fake_server(work, env={"FAKE_SGLANG_TOKEN_S": "0.002"}) as (_proc, url):
            code = bench(url, "glm-5", [1, 4], 32, 64, runner, NvmlSampler(0.1), None, None, None,
                         work / "results", allreduce_us=13.0)
    finally:
        load.terminate()
        load.wait(10)
    print("e2e exit", code)
    with tarfile.open(out / "e2e.tar.gz", "w:gz") as tar:
        tar.add(work / "results", arcname="results")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    record(out)
    if "--e2e" in sys.argv:
        e2e(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
