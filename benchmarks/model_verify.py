#!/usr/bin/env python3
"""``verify: full`` throughput as a ratio of ``sha256sum`` over the same files, per core used (goal >= 0.9).

A checkpoint made by the real safetensors library (gpunode_lab.checkpoint) and its manifest (the
sha256 of each file, as the Hub lists them); the files read once first, so that both read from the
page cache and the comparison is of the hashing, not of the disk. Each round runs
gpunode.stages.model.verify.verify(level="full", workers=W) (every file's sha256 against the
manifest, W at a time, every safetensors header, the index and config.json), ``sha256sum`` over
the same files in one process (one core), and ``sha256sum`` given the same cores as verify (``xargs -P``,
one process per file, the largest first, as verify's pool takes them). Two per-core ratios, best round
against best round, with C = min(W, files, cores):

- ``ratio_per_core``: (verify's rate / C) / one sha256sum's rate, against a sha256sum that would scale
  with cores without limit;
- ``ratio_same_cores``: verify's rate / the rate of C sha256sums at once: per core used, each given
  the same cores, so that what bounds both (the memory's bandwidth on a many-core machine) bounds
  the baseline as well. The goal is judged on this one.

    .venv/bin/python benchmarks/model_verify.py [--shards 4] [--shard-mb 256] [--workers N] [--rounds 3]

Prints JSON; exits 1 when the ratio misses the goal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 0.9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from gpunode.stages.model.manifest import FileEntry, Manifest
    from gpunode.stages.model.verify import verify
    from gpunode_lab import checkpoint

    with tempfile.TemporaryDirectory(prefix="gpunode-bench-verify-") as tmp:
        folder = Path(tmp) / "weights"
        made = checkpoint.make(folder, shards=args.shards, shard_bytes=args.shard_mb << 20)
        names = sorted(made["files"])
        entries = []
        for name in names:  # the manifest, and every byte in the page cache
            with open(folder / name, "rb") as handle:
                entries.append(FileEntry(name, (folder / name).stat().st_size,
                                         hashlib.file_digest(handle, "sha256").hexdigest(), None))
        manifest = Manifest("bench/GLM-5-NVFP4", "0" * 40, entries)
        total = sum(e.size for e in entries)
        rounds: dict[str, list[float]] = {"verify_full": [], "sha256sum": [], "sha256sum_same_cores": []}
        cores = max(1, min(args.workers, len(names), os.cpu_count() or 1))
        largest_first = sorted(names, key=lambda name: -(folder / name).stat().st_size)
        for _ in range(args.rounds):
            start = time.perf_counter()
            report = verify(folder, manifest=manifest, level="full", workers=args.workers, source="hub",
                            architecture="GlmMoeDsaForCausalLM",
                            quantization={"quant_method": "modelopt", "quant_algo": "NVFP4"})
            rounds["verify_full"].append(time.perf_counter() - start)
            if not report.ok or report.hashed_files != len(names):
                raise SystemExit(f"verify did not hash and pass every file: {report.as_dict()['findings'][:3]}")
            start = time.perf_counter()
            subprocess.run(["sha256sum", "--", *names], cwd=folder, check=True, stdout=subprocess.DEVNULL)
            rounds["sha256sum"].append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run(["xargs", "-0", "-P", str(cores), "-n", "1", "sha256sum", "--"], cwd=folder, check=True,
                           input="\0".join(largest_first).encode(), stdout=subprocess.DEVNULL)
            rounds["sha256sum_same_cores"].append(time.perf_counter() - start)
    rate = {who: total / min(times) for who, times in rounds.items()}
    per_core = rate["verify_full"] / cores / rate["sha256sum"]
    same_cores = rate["verify_full"] / rate["sha256sum_same_cores"]
    report_out: dict[str, Any] = {
        "files": len(names), "bytes": total, "workers": args.workers, "cores_used": cores, "rounds": rounds,
        "verify_full_MBps": round(rate["verify_full"] / 1e6, 1), "sha256sum_MBps": round(rate["sha256sum"] / 1e6, 1),
        "sha256sum_same_cores_MBps": round(rate["sha256sum_same_cores"] / 1e6, 1),
        "ratio_per_core": round(per_core, 3), "ratio_same_cores": round(same_cores, 3),
        "goal": GOAL, "met": same_cores >= GOAL,
        "note": "page-cached: the hashing compared, not the disk; verify's time includes the headers, index and config"}
    print(json.dumps(report_out, indent=1))
    return 0 if report_out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
