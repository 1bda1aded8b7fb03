#!/usr/bin/env python3
"""Time `gpunode --help`, `gpunode plan` and `gpunode validate` on the example host file, as a user
runs them, and count the modules `validate` loads.

Targets: --help under 1 s, plan under 2 s (issue 2); validate under 1 s, loading neither docker,
ansible_runner nor the lab (issue 33: 645 modules, docker among them, and 0.86 s before the floors). Each command runs
as a fresh process (imports included) REPEAT times; the median is compared with the target. Prints
JSON; exits 1 when a target is missed.

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
TARGETS = {"help": 1.0, "plan": 2.0, "validate": 1.0}
# Run validate in-process and report what it imported: the count and the heavy ones it must not.
COUNT_MODULES = """
import atexit, json, runpy, sys
def report():
    heavy = sorted(name for name in ("docker", "ansible_runner", "gpunode_lab") if name in sys.modules)
    sys.stderr.write(json.dumps({"modules": len(sys.modules), "heavy": heavy}) + "\\n")
atexit.register(report)
sys.argv = ["gpunode", "validate", sys.argv[1]]
runpy.run_module("gpunode", run_name="__main__")
"""


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
    example = str(ROOT / "inventory" / "example" / "host.yml")
    commands = {"help": base + ["--help"], "plan": base + ["plan", example], "validate": base + ["validate", example]}
    results = {}
    for name, argv in commands.items():
        time_once(argv)  # warm the page cache; not counted
        samples = [time_once(argv) for _ in range(args.repeat)]
        median = statistics.median(samples)
        results[name] = {"median_s": round(median, 3), "max_s": round(max(samples), 3), "target_s": TARGETS[name],
                         "pass": median < TARGETS[name], "samples": len(samples)}
    loaded = subprocess.run([sys.executable, "-c", COUNT_MODULES, example], capture_output=True, text=True, cwd=ROOT)
    counted = json.loads(loaded.stderr.strip().splitlines()[-1])
    results["validate"].update(modules=counted["modules"], modules_before_floors=645, heavy=counted["heavy"])
    results["validate"]["pass"] = results["validate"]["pass"] and not counted["heavy"]
    print(json.dumps(results, indent=2))
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
