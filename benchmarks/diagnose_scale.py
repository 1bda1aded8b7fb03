#!/usr/bin/env python3
"""`gpunode diagnose` on logs that used to cost it dearly (issue 31, item 5), as a user runs it.

- `long_line`: a short server log with one 1 MB line of "NCCL error in: " repeated (the prefix of a
  pattern that backtracked over the rest of the line at each repeat: 35 s before), then the real
  failure. Target: the failure named, under 1 s for the whole process.
- `big_log`: 200 MB of an SGLang server's log (its arguments, the start, hours of batches and
  requests) with an NCCL watchdog failure near the end (before: 0.5 GB of memory). Target: the
  failure named, under 10 s and under 200 MB peak RSS.
- `huge_log` (with --huge-mb N): the same log at N MB, past the 256 MiB that diagnose reads of a
  file (its first 16 and last 240 MiB); same targets.

Each runs `python -m gpunode diagnose FILE --json` as a fresh process; wall time from the parent,
peak RSS of that process from wait4's rusage. The logs are generated in a temporary folder and
removed. Prints a table; exits 1 when a target, an exit code or a finding is missed.

    python benchmarks/diagnose_scale.py [--big-mb 200] [--huge-mb 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000
TARGETS = {"long_line": (1.0, None), "big_log": (10.0, 200.0), "huge_log": (10.0, 200.0)}

SERVER_ARGS = ("[2026-12-01 07:30:00] server_args=ServerArgs(model_path='/model', tokenizer_path='/model', "
               "api_key='sk-bench-not-a-secret', admin_api_key=None, tp_size=8, mem_fraction_static=0.92, "
               + ", ".join(f"option_{i}={i}" for i in range(300)) + ")\n")
START = [
    "[2026-12-01 07:30:05 TP0] Init torch distributed begin.\n",
    "[2026-12-01 07:30:09 TP0] Init torch distributed ends. mem usage=0.41 GB\n",
    "[2026-12-01 07:30:10 TP0] Load weight begin. avail mem=93.12 GB\n",
    *(f"Loading safetensors checkpoint shards: {p:3d}% Completed | {p}/100 [00:{p % 60:02d}<00:30,  3.1it/s]\r"
      for p in range(0, 101, 5)),
    "\n[2026-12-01 07:31:07 TP0] Load weight end. elapsed=57.31 s, type=GlmMoeDsaForCausalLM, mem usage=53.90 GB\n",
    "[2026-12-01 07:31:20 TP0] Memory pool end. avail mem=8.20 GB\n",
    "[2026-12-01 07:31:30 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=8.10 GB\n",
    "[2026-12-01 07:32:10] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n",
    "[2026-12-01 07:32:30] The server is fired up and ready to roll!\n",
]
FAILURE = [
    "[rank1]:[E1201 11:35:43.221307236 ProcessGroupNCCL.cpp:685] [PG ID 2 PG GUID 3(TP) Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9041, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600083 milliseconds before timing out.\n",
    "[rank1]:[E1201 11:35:43.300000000 ProcessGroupNCCL.cpp:2168] Some NCCL operations have failed or timed out. "
    "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
    "data.\n",
    "Traceback (most recent call last):\n",
    '  File "/opt/sglang/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2701, in run\n',
    "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.\n",
    "[2026-12-01 11:35:44] Received sigquit from a child process. It usually means the child failed.\n",
]


def serving_block(hour: int) -> str:
    """About 1 MB of what a serving SGLang logs: batches and requests."""
    lines = []
    for i in range(3600):
        at = f"2026-12-01 {8 + hour % 3:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
        if i % 3 == 0:
            lines.append(f"[{at} TP0] Prefill batch. #new-seq: 1, #new-token: {512 + i % 700}, #cached-token: "
                         f"{i % 4096}, token usage: 0.{i % 90:02d}, #running-req: {i % 48}, #queue-req: 0\n")
        elif i % 3 == 1:
            lines.append(f"[{at} TP0] Decode batch. #running-req: {i % 48}, #token: {18234 + i}, token usage: "
                         f"0.{i % 90:02d}, cuda graph: True, gen throughput (token/s): {1200 + i % 300}.{i % 100:02d}, "
                         "#queue-req: 0\n")
        else:
            lines.append(f'[{at}] INFO:     10.0.0.{i % 250}:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    return "".join(lines)


def write_big(path: Path, size: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.write(SERVER_ARGS + "".join(START))
        written, hour = out.tell(), 0
        tail = sum(len(line) for line in FAILURE)
        while written < size - tail:
            block = serving_block(hour)
            block = block[:max(0, size - tail - written)]
            block = block[:block.rfind("\n") + 1] if "\n" in block else ""
            if not block:
                break
            out.write(block)
            written, hour = written + len(block), hour + 1
        out.write("".join(FAILURE))


def write_long_line(path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.write(SERVER_ARGS + "".join(START))
        out.write("[2026-12-01 07:40:00 TP3] " + "NCCL error in: " * (MB // 15) + "\n")
        out.write("RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n")


def run(path: Path) -> tuple[float, float, int, list[str]]:
    """Wall seconds, peak RSS in MB, exit code and the finding ids of one diagnose process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "gpunode", "diagnose", str(path), "--json"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    try:
        ids = [found["id"] for found in json.loads(out)["findings"]]
    except (ValueError, KeyError, TypeError):
        ids = ["(no JSON)"]
    return seconds, usage.ru_maxrss / 1024, child.returncode, ids  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-mb", type=int, default=200)
    parser.add_argument("--huge-mb", type=int, default=0, help="also a log of this many MB (0: not run)")
    args = parser.parse_args()
    want = {"long_line": ["nccl_error"], "big_log": ["nccl_watchdog"], "huge_log": ["nccl_watchdog"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {"long_line": (write_long_line, None), "big_log": (write_big, args.big_mb * MB)}
        if args.huge_mb:
            cases["huge_log"] = (write_big, args.huge_mb * MB)
        for name, (write, size) in cases.items():
            path = folder / f"{name}.log"
            write(path) if size is None else write(path, size)
            seconds, rss_mb, code, ids = run(path)
            path.unlink()
            max_s, max_rss = TARGETS[name]
            ok = seconds < max_s and (max_rss is None or rss_mb < max_rss) and code == 0 and ids == want[name]
            rows.append((name, f"{(size or 0) / MB:.0f}" if size else "1 line", seconds, max_s, rss_mb,
                         max_rss, code, ",".join(ids), ok))
    print(f"{'case':<10} {'log MB':>7} {'wall s':>7} {'goal s':>7} {'peak MB':>8} {'goal MB':>8} {'exit':>4}  "
          f"{'findings':<16} pass")
    for name, size_mb, seconds, max_s, rss_mb, max_rss, code, ids, ok in rows:
        print(f"{name:<10} {size_mb:>7} {seconds:>7.2f} {max_s:>7.1f} {rss_mb:>8.1f} "
              f"{'-' if max_rss is None else f'{max_rss:.0f}':>8} {code:>4}  {ids:<16} {'yes' if ok else 'NO'}")
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
