#!/usr/bin/env python3
"""Provisioning two lab hosts against one, in one run: does a fleet provision in parallel?

The lab fleet (inventory/lab/fleet.yml, `gpunode lab up`) has two hosts, each with its own API,
host container and GPU node. Two workloads, each timed for one host (``--limit pve-lab1``) and for
both, alternately, ROUNDS times; the ratio of the medians is the answer (1.0: perfectly parallel,
2.0: serial):

* converged: every host stage (host, container, node, image, serve, smoke; the router is the
  fleet's, not a host's, and is left out) on a node that is already right: what a re-run costs;
* repair: the same after each host's server container was removed, so that serve starts a server
  and smoke proves it again: work on every node.

The fleet is provisioned once before the timing (not timed). JSON on stdout:

    python benchmarks/fleet_parallel.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import gpunode_lab as lab  # noqa: E402

FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
STAGES = "host,container,node,image,serve,smoke"
TARGET = 1.3


def provision(*args: str) -> float:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpunode", "provision", str(FLEET), "--tags", STAGES, "--json", *args],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=1800)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"provision {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return seconds


def remove_servers(ips: list[str]) -> None:
    for ip in ips:
        subprocess.run(lab.ssh_command("docker rm -f gpunode-sglang", host=ip), capture_output=True, timeout=120,
                       check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    provision()  # converge first, untimed
    nodes = {"one": [lab.SITE.gpu.ip], "two": [site.gpu.ip for site in lab.SITES]}
    limits = {"one": ("--limit", "pve-lab1"), "two": ()}
    times: dict[str, dict[str, list[float]]] = {"converged": {"one": [], "two": []}, "repair": {"one": [], "two": []}}
    for _ in range(args.rounds):
        for size in ("one", "two"):
            times["converged"][size].append(provision(*limits[size]))
            remove_servers(nodes[size])
            times["repair"][size].append(provision(*limits[size]))
    out: dict[str, object] = {"rounds": args.rounds, "stages": STAGES, "cores": os.cpu_count(), "target": TARGET}
    for workload, sizes in times.items():
        one, two = statistics.median(sizes["one"]), statistics.median(sizes["two"])
        out[workload] = {"one_host_s": [round(s, 1) for s in sizes["one"]], "two_hosts_s": [round(s, 1) for s in sizes["two"]],
                         "median_one_s": round(one, 1), "median_two_s": round(two, 1), "ratio": round(two / one, 2),
                         "within_target": two / one <= TARGET}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
