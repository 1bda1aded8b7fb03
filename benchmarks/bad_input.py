#!/usr/bin/env python3
"""Bad input costs nothing (issue 15): how fast gpunode refuses it, as a user runs it.

- `billion_laughs`: `gpunode validate` on a 9-line file whose YAML aliases expand to 9^9 values
  (before the bound: 38 s and 2.4 GB); target: refused, exit 2, under 1 s for the whole process.
- `self_alias`: a self-referencing alias (before: a RecursionError traceback); same target.
- `refused_api`: `gpunode plan --live` against a Proxmox API port on loopback that refuses
  connections (before, provision took 47 s and exited 1); target: exit 3 within 15 s.

Each command runs as a fresh process REPEAT times; the median is compared with the target.
Prints JSON; exits 1 when a target or an exit code is missed.

    python benchmarks/bad_input.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi"))
SELF_ALIAS = "version: 1\nhosts: &h\n  - name: pve1\n    more: *h\n"
TARGETS = {"billion_laughs": (1.0, 2), "self_alias": (1.0, 2), "refused_api": (15.0, 3)}


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def refused_api_hosts(folder: Path) -> Path:
    """The example host file with its API on a loopback port nothing listens on."""
    text = (ROOT / "inventory" / "example" / "host.yml").read_text()
    text = text.replace("https://192.0.2.10:8006", f"https://127.0.0.1:{closed_port()}")
    # The example's CA file is not on this machine; the connection is refused before TLS anyway.
    text = "\n".join(line for line in text.splitlines() if "ca_file:" not in line) + "\n"
    assert "192.0.2.10:8006" not in text
    path = folder / "refused.yml"
    path.write_text(text)
    return path


def time_once(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env={"PVE_ROOT_PASSWORD": "not-used", "PATH": "/usr/bin:/bin"}, timeout=120).returncode
    return time.perf_counter() - start, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    gpunode = [sys.executable, "-m", "gpunode"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "laughs.yml").write_text(LAUGHS)
        (folder / "self.yml").write_text(SELF_ALIAS)
        commands = {"billion_laughs": gpunode + ["validate", str(folder / "laughs.yml")],
                    "self_alias": gpunode + ["validate", str(folder / "self.yml")],
                    "refused_api": gpunode + ["plan", "--live", str(refused_api_hosts(folder))]}
        results = {}
        for name, argv in commands.items():
            runs = [time_once(argv) for _ in range(args.repeat)]
            median = statistics.median(seconds for seconds, _ in runs)
            target_s, want_code = TARGETS[name]
            codes = sorted({code for _, code in runs})
            results[name] = {"median_s": round(median, 3), "max_s": round(max(s for s, _ in runs), 3),
                             "target_s": target_s, "exit_codes": codes, "want_exit": want_code,
                             "pass": median < target_s and codes == [want_code], "samples": len(runs)}
    print(json.dumps(results, indent=2))
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
