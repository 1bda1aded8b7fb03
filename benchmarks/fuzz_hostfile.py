#!/usr/bin/env python3
"""The host file fuzzed at length (issue #31): the mutations of tests/unit/test_hostfile_fuzz.py
(tests/fakes/hostfile_fuzz.py) for N cases, each run through `validate` and `plan --json`
in-process with the same checks (exit 0 or 2, no traceback, one printable line per error, CPU
time under 2 s, no network, a plan wherever validate passed).

Prints JSON: cases, cases/s (wall clock and CPU), the exit codes seen, the slowest case by CPU
time, and every failure (its file, the change and what went wrong). Exits 1 on any failure.

    python benchmarks/fuzz_hostfile.py [--cases 5000] [--seed 31]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes import hostfile_fuzz as fuzz  # noqa: E402 - tests/ put on the path just above
from typer.testing import CliRunner  # noqa: E402

RUNNER_ENV = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None, "COLUMNS": "200"}
PLAIN = "abcxyz0123456789-_./:~+ "


def drawn(rng: random.Random) -> str:
    """A fragment of its own (where the test has hypothesis draw one): any characters, any number."""
    kind = rng.randrange(5)
    if kind == 0:
        return json.dumps("".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(40))))
    if kind == 1:
        return "".join(rng.choice(PLAIN) for _ in range(rng.randrange(1, 40))).strip() or "x"
    if kind == 2:
        return str(rng.randrange(-(10 ** 30), 10 ** 30))
    if kind == 3:
        return repr(rng.choice([rng.uniform(-1e6, 1e6), float("inf"), float("nan"), 1e308 * 10, -0.0]))
    return json.dumps({"k": [rng.randrange(9), None, True, {"x": "y"}]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    values = fuzz.catalogue()
    runner = CliRunner(env=RUNNER_ENV)
    exits: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    slowest = (0.0, "")
    cpu_total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host.yml"
        start = time.perf_counter()
        for _ in range(args.cases):
            case = fuzz.mutated(rng, values, drawn)
            outcome = fuzz.check(case, path, runner)
            cpu_total += outcome.cpu_s
            exits[f"validate {outcome.validate_exit}" + ("" if outcome.plan_exit is None
                                                         else f", plan {outcome.plan_exit}")] += 1
            if outcome.cpu_s > slowest[0]:
                slowest = (outcome.cpu_s, f"{case.base}: {case.what}")
            if outcome.problems:
                failures.append(fuzz.describe(case, outcome))
        wall = time.perf_counter() - start
    print(json.dumps({"cases": args.cases, "seed": args.seed, "wall_s": round(wall, 1),
                      "cases_per_s": round(args.cases / wall, 1), "cpu_s": round(cpu_total, 1),
                      "cases_per_cpu_s": round(args.cases / cpu_total, 1), "exits": dict(exits),
                      "slowest_cpu_s": round(slowest[0], 3), "slowest_case": slowest[1],
                      "cpu_bound_s": fuzz.CPU_BOUND_S, "failures": len(failures),
                      "failed_cases": [failure[:600] for failure in failures[:50]]}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
