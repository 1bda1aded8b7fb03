#!/usr/bin/env python3
"""``verify: full`` throughput as a ratio of ``sha256sum`` over the same files, per core used (goal >= 0.9).

A checkpoint made by the real safetensors library (gpunode_lab.checkpoint) and its manifest (the
sha256 of each file, as the Hub lists them); the files read once first, so that both read from the
page cache and the comparison is of the hashing, not of the disk. Each round runs
gpunode.stages.model.verify.verify(level="full", workers=W) (every file's sha256 against the
manifest, W at a time, every safetensors header, the index and config.json) and ``sha256sum`` over
the same files (one process: one core). The per-core ratio is (verify's rate / the cores it can use,
min(W, files, cores)) / sha256sum's rate, best round against best round.

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
        rounds: dict[str, list[float]] = {"verify_full": [], "sha256sum": []}
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
    cores = max(1, min(args.workers, len(names), os.cpu_count() or 1))
    rate = {who: total / min(times) for who, times in rounds.items()}
    per_core = rate["verify_full"] / cores / rate["sha256sum"]
    report_out: dict[str, Any] = {
        "files": len(names), "bytes": total, "workers": args.workers, "cores_used": cores, "rounds": rounds,
        "verify_full_MBps": round(rate["verify_full"] / 1e6, 1), "sha256sum_MBps": round(rate["sha256sum"] / 1e6, 1),
        "ratio_per_core": round(per_core, 3), "goal": GOAL, "met": per_core >= GOAL,
        "note": "page-cached: the hashing compared, not the disk; verify's time includes the headers, index and config"}
    print(json.dumps(report_out, indent=1))
    return 0 if report_out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
