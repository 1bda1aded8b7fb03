#!/usr/bin/env python3
"""Day two in the lab (issue 36): what a rolling change keeps serving, how long `gpunode check`
takes, and what a provision that changes nothing costs against a first one. JSON on stdout; exits
1 when a goal is missed.

    python benchmarks/day_two.py roll [--concurrency 8] [--steady-s 30]
    python benchmarks/day_two.py check [--repeat 5]
    python benchmarks/day_two.py provision [--repeat 3]

roll: the lab fleet (inventory/lab/fleet.yml) with each server capped at two running requests
(``--max-running-requests 2``: the stand-in queues the rest, as sglang's scheduler does), so that
a worker's capacity, not the client, sets the pace. Requests (/generate, 300 tokens, 2 ms each on
the stand-in) go through the router from ``--concurrency`` threads; the requests completed per
second while a change that restarts both servers rolls through the fleet are compared with those
completed in ``--steady-s`` seconds just before, in the same run. Goal: at least 0.45 (one of two
workers serving at a time). Every request must succeed. The fleet is left as inventory/lab/fleet.yml
says.

check: `gpunode check inventory/lab/host.yml` (every layer) ``--repeat`` times on a converged lab
node; the median, against the goal of 8 s.

provision: the lab node made afresh (`gpunode lab down` and `up`: untimed), then the first provision
of inventory/lab/host.yml and ``--repeat`` more that change nothing, in the same run; their median
as a share of the first, against the goal of 15 %.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
HOST = ROOT / "inventory" / "lab" / "host.yml"
GOALS = {"roll_ratio": 0.45, "check_s": 8.0, "no_change_share": 0.15}


def gpunode(*args: str, timeout: float = 1800) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpunode", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"}, stdin=subprocess.DEVNULL)
    return time.monotonic() - began, done


def must(seconds_and_done: tuple[float, subprocess.CompletedProcess[str]], what: str) -> float:
    seconds, done = seconds_and_done
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return seconds


class Load:
    """/generate requests through the router from ``threads`` threads; completions and failures with their times."""

    def __init__(self, url: str, key: str, threads: int) -> None:
        self.url, self.key, self.threads = url, key, threads
        self.done: list[float] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.workers = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]

    def _send(self) -> None:
        session = requests.Session()
        session.trust_env = False
        session.headers["Authorization"] = f"Bearer {self.key}"
        while not self.stop.is_set():
            body = {"text": f"{secrets.token_hex(8)} count", "sampling_params": {"max_new_tokens": 300}}
            try:
                reply = session.post(f"{self.url}/generate", json=body, timeout=120)
                (self.done.append(time.monotonic()) if reply.status_code == 200
                 else self.failed.append(str(reply.status_code)))
            except requests.RequestException as exc:
                self.failed.append(type(exc).__name__)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def finish(self) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.join(timeout=180)

    def rate(self, start: float, end: float) -> float:
        return sum(1 for at in self.done if start <= at < end) / (end - start)


def fleet_variant(folder: Path, name: str, flags: dict[str, Any]) -> Path:
    data = yaml.safe_load(FLEET.read_text())
    for host in data["hosts"]:
        host["server"].setdefault("flags", {}).update(flags)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def roll(args: argparse.Namespace) -> dict[str, Any]:
    import gpunode_lab as lab
    from gpunode import derive, hostfile

    fleet = hostfile.load(FLEET)
    routed = derive.derive_router(fleet)
    assert routed is not None
    key = lab.FLEET_API_KEY.read_text().strip()
    with tempfile.TemporaryDirectory() as folder:
        capped = fleet_variant(Path(folder), "capped.yml", {"--max-running-requests": 2})
        # A flag that restarts every server and leaves its capacity alone. Not --enable-metrics: the
        # profiles turn it on themselves (the monitor stage's metrics), so it changed nothing and no
        # host rolled, which the pass rule below now catches.
        changed = fleet_variant(Path(folder), "changed.yml",
                                {"--max-running-requests": 2, "--enable-metrics-for-all-schedulers": True})
        must(gpunode("provision", str(capped), "--json"), "converging the capped fleet")
        load = Load(routed.url, key, args.concurrency)
        load.start()
        steady_start = time.monotonic()
        time.sleep(args.steady_s)
        roll_start = time.monotonic()
        seconds, done = gpunode("provision", str(changed), "--json")
        roll_end = time.monotonic()
        load.finish()
        summary = json.loads(done.stdout) if done.stdout.strip() else {}
        must(gpunode("provision", str(FLEET), "--json"), "putting the fleet back as fleet.yml says")
    # A roll that took no host out measured nothing: the change must have restarted each server in turn.
    rolled = (summary.get("roll") or {}).get("batches") or []
    every_host_rolled = sorted(name for batch in rolled for name in batch) == sorted(h.name for h in fleet.hosts)
    steady, during = load.rate(steady_start, roll_start), load.rate(roll_start, roll_end)
    ratio = during / steady if steady else 0.0
    return {"concurrency": args.concurrency, "steady_s": args.steady_s, "steady_rps": round(steady, 2),
            "roll_s": round(seconds, 1), "roll_rps": round(during, 2), "ratio": round(ratio, 2),
            "goal": GOALS["roll_ratio"], "requests": len(load.done), "failed": load.failed,
            "rolled": rolled, "exit_code": done.returncode,
            "pass": done.returncode == 0 and not load.failed and ratio >= GOALS["roll_ratio"] and every_host_rolled}


def check(args: argparse.Namespace) -> dict[str, Any]:
    must(gpunode("provision", str(HOST), "--json"), "converging the lab node")
    samples = [must(gpunode("check", str(HOST), "--json", timeout=600), "gpunode check") for _ in range(args.repeat)]
    median = statistics.median(samples)
    return {"samples_s": [round(s, 1) for s in samples], "median_s": round(median, 1), "goal_s": GOALS["check_s"],
            "pass": median < GOALS["check_s"]}


def provision(args: argparse.Namespace) -> dict[str, Any]:
    for verb in ("down", "up"):
        must(gpunode("lab", verb, timeout=1800), f"gpunode lab {verb}")
    first = must(gpunode("provision", str(HOST), "--json"), "the first provision")
    samples, changed = [], 0
    for _ in range(args.repeat):
        seconds, done = gpunode("provision", str(HOST), "--json")
        samples.append(must((seconds, done), "a provision that changes nothing"))
        changed += sum(json.loads(done.stdout)["stats"].get("changed", {}).values())
    share = statistics.median(samples) / first
    return {"first_s": round(first, 1), "no_change_s": [round(s, 1) for s in samples], "share": round(share, 3),
            "changed_after_the_first": changed, "goal": GOALS["no_change_share"],
            "pass": changed == 0 and share <= GOALS["no_change_share"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rolled = sub.add_parser("roll")
    rolled.add_argument("--concurrency", type=int, default=8)
    rolled.add_argument("--steady-s", type=float, default=30.0)
    checked = sub.add_parser("check")
    checked.add_argument("--repeat", type=int, default=5)
    provisioned = sub.add_parser("provision")
    provisioned.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = {"roll": roll, "check": check, "provision": provision}[args.what](args)
    print(json.dumps({args.what: result, "cores": os.cpu_count()}, indent=2))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
