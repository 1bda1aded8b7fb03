#!/usr/bin/env python3
"""Measure, against the fake SGLang 0.5.9 server (tests/fakes), the two latencies issue 8 sets:

* readiness: from the moment the server is ready (its "The server is fired up and ready to roll!"
  line, seen by an independent observer polling the log every 5 ms) to ``wait_ready`` returning.
  The fake keeps sglang's real health behaviour: /health_generate sleeps a 1 s tick before it
  answers 200. Target: under 2 s.
* smoke overhead: a full ``smoke`` run on a ready server (every check, and the bench through the
  stand-in ``python3 -m sglang.bench_serving``) minus the time spent waiting on the server (HTTP
  requests and the bench's own measured duration). The fake answers almost at once, so the whole
  run's wall time is shown too, as an upper bound. Target: overhead under 10 s.

Each is measured REPEAT times; medians and maxima are compared with the targets. Prints JSON;
exits 1 when a target is missed.

    .venv/bin/python benchmarks/smoke_overhead.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes import SHIM  # noqa: E402 - the test fakes, put on the path just above
from fakes.process import fake_server, model_dir  # noqa: E402

from gpunode.stages.serve import readiness  # noqa: E402
from gpunode.stages.smoke import bench  # noqa: E402
from gpunode.stages.smoke.command import smoke  # noqa: E402

TARGETS = {"readiness_latency_s": 2.0, "smoke_overhead_s": 10.0}
REAL_HEALTH = {"FAKE_SGLANG_HEALTH_TICK_S": "1.0"}  # sglang's asyncio.sleep(1) in health_generate


def observe_ready(log_path: Path, seen: dict[str, float], stop: threading.Event) -> None:
    while not stop.is_set():
        if "fired up and ready to roll" in log_path.read_text(errors="replace"):
            seen["ready_at"] = time.monotonic()
            return
        time.sleep(0.005)


def readiness_latency(tmp: Path) -> dict[str, float]:
    env = {**REAL_HEALTH, "FAKE_SGLANG_LOAD_S": "0.5", "FAKE_SGLANG_WARMUP_S": "0.8"}
    with fake_server(tmp, env=env, wait=False) as (process, url):
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=observe_ready, args=(process.log_path, seen, stop), daemon=True)
        watcher.start()
        result = readiness.wait_ready(process, readiness.HttpHealthProbe(url), timeout_s=30)
        noticed = time.monotonic()
        stop.set()
        watcher.join()
    if not result.ready or "ready_at" not in seen:
        raise RuntimeError(f"the fake never became ready: {result.as_dict()}")
    return {"latency_s": noticed - seen["ready_at"], "startup_s": result.elapsed_s}


def smoke_once(tmp: Path) -> dict[str, float]:
    runner = bench.LocalBenchRunner(str(model_dir(tmp)), python=[sys.executable], extra_env={"PYTHONPATH": str(SHIM)})
    with fake_server(tmp, env=REAL_HEALTH) as (_process, url):
        out = io.StringIO()
        began = time.perf_counter()
        code = smoke(url, "glm-5", None, runner, True, out)
        wall = time.perf_counter() - began
    report = json.loads(out.getvalue())
    if code != 0:
        raise RuntimeError(f"smoke failed on the fake: {out.getvalue()}")
    timings = report["timings"]
    return {"wall_s": wall, "overhead_s": timings["overhead_s"], "server_s": timings["server_s"],
            "bench_wall_s": timings["bench_wall_s"]}


def summary(samples: list[dict[str, float]], key: str) -> dict[str, float]:
    values = [s[key] for s in samples]
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3), "min": round(min(values), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-") as folder:
        tmp = Path(folder)
        ready = [readiness_latency(tmp) for _ in range(args.repeat)]
        smokes = [smoke_once(tmp) for _ in range(args.repeat)]
    latency = summary(ready, "latency_s")
    overhead = summary(smokes, "overhead_s")
    results = {
        "readiness_latency_s": {**latency, "target": TARGETS["readiness_latency_s"],
                                "pass": latency["max"] < TARGETS["readiness_latency_s"],
                                "poll_interval_s": readiness.POLL_S, "samples": len(ready)},
        "smoke_overhead_s": {**overhead, "target": TARGETS["smoke_overhead_s"],
                             "pass": overhead["max"] < TARGETS["smoke_overhead_s"], "samples": len(smokes)},
        "smoke_wall_s": summary(smokes, "wall_s"),
        "smoke_server_s": summary(smokes, "server_s"),
        "smoke_bench_wall_s": summary(smokes, "bench_wall_s"),
    }
    print(json.dumps(results, indent=2))
    return 0 if results["readiness_latency_s"]["pass"] and results["smoke_overhead_s"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
