#!/usr/bin/env python3
"""Time `gpunode --help` and `gpunode plan` on the example host file, as a user runs them.

Targets (issue 2): --help under 1 s, plan under 2 s. Each command runs as a fresh process
(imports included) REPEAT times; the median is compared with the target. Prints JSON; exits 1
when a target is missed.

    python benchmarks/cli_speed.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"help": 1.0, "plan": 2.0}


def gpunode_command() -> list[str]:
    found = shutil.which("gpunode", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "gpunode"]


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    base = gpunode_command()
    commands = {"help": base + ["--help"], "plan": base + ["plan", str(ROOT / "inventory" / "example" / "host.yml")]}
    results = {}
    for name, argv in commands.items():
        time_once(argv)  # warm the page cache; not counted
        samples = [time_once(argv) for _ in range(args.repeat)]
        median = statistics.median(samples)
        results[name] = {"median_s": round(median, 3), "max_s": round(max(samples), 3), "target_s": TARGETS[name],
                         "pass": median < TARGETS[name], "samples": len(samples)}
    print(json.dumps(results, indent=2))
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
