#!/usr/bin/env python3
"""PROJECTION (not a measurement) of the p2p check's run time on an 8-GPU node (56 ordered pairs).

Only single-GPU machines were available, so the 8-GPU time is projected from durations that were
measured on one H200 (tests/fixtures/p2p):

- start-up (NVML + torch import + CUDA init) and the per-GPU part (host buffers, H2D, D2H, D2D,
  latencies, link under load) come from the check's own run (p2p.json);
- the per-pair fixed cost (poisoning, verification, events, stream set-up, latency loop) comes from
  the pair code path run with one GPU as both ends (pair_path.json): its wall time minus the time
  its copies took at the rate they were measured at;
- the copy time of a real pair is then recomputed with the check's own sampling rule (warm-up
  copies, then samples of enough copies to last min_sample_s) at an assumed P2P bandwidth.

Bandwidth scenarios: the public RTX PRO 6000 Gen5 x16 numbers (FIELD-NOTES s1: unidirectional
53-56 same NUMA, 39-51 across sockets; bidirectional 103-111 / 64-99; the low ends are used), the
default expectations with no bidirectional overlap (45 / 35 GB/s), and P2P unavailable with copies
staged through host memory (assumed: the measured D2H then H2D, one after the other).

    python benchmarks/p2p_time.py [--gpus 8] [--same-numa-gpus 4]

Prints JSON; exits 1 when a scenario's projection misses the 90 s target.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "p2p"
TARGET_S = 90.0
GB = 1e9


def copies_moved(method: dict[str, Any], seconds_per_copy: float) -> tuple[int, int]:
    """(copies per sample, copies in the whole measurement) under the check's sampling rule."""
    per_sample = max(1, min(method["max_copies_per_sample"], math.ceil(method["min_sample_s"] / seconds_per_copy)))
    return per_sample, method["warmup_copies"] + method["samples"] * per_sample


def fixed_costs(pair_path: dict[str, Any]) -> dict[str, float]:
    """Seconds of each pair measurement that do not scale with bandwidth, from the recorded run."""
    method, pair = pair_path["method"], pair_path["pair"]
    uni, bidir, latency = pair["uni"], pair["bidir"], pair["latency"]
    uni_copies = method["warmup_copies"] + method["samples"] * uni["copies_per_sample"]
    uni_copy_s = uni_copies * uni["bytes_per_copy"] / (uni["median_gbps"] * GB)
    bidir_copies = method["warmup_copies"] + method["samples"] * bidir["copies_per_sample"]
    bidir_copy_s = bidir_copies * 2 * bidir["bytes_per_copy"] / (bidir["median_gbps"] * GB)
    steps = uni["seconds"] + bidir["seconds"] + latency["seconds"]
    return {
        "uni_s": uni["seconds"] - uni_copy_s,
        "bidir_s": bidir["seconds"] - bidir_copy_s,
        "latency_s": latency["seconds"],
        "setup_s": pair_path["measure_pair_s"] - steps,  # expected patterns, streams
    }


def pair_seconds(method: dict[str, Any], nbytes: int, fixed: dict[str, float], uni_gbps: float,
                 bidir_gbps: float) -> float:
    _, uni_copies = copies_moved(method, nbytes / (uni_gbps * GB))
    _, bidir_copies = copies_moved(method, 2 * nbytes / (bidir_gbps * GB))
    return (fixed["setup_s"] + fixed["uni_s"] + uni_copies * nbytes / (uni_gbps * GB)
            + fixed["bidir_s"] + bidir_copies * 2 * nbytes / (bidir_gbps * GB) + fixed["latency_s"])


def project(check: dict[str, Any], pair_path: dict[str, Any], gpus: int, same_numa_gpus: int) -> dict[str, Any]:
    method = check["method"]
    nbytes = method["size_bytes"]
    measured = check["measurements"]
    startup_s = check["timing"]["nvml_s"] + check["timing"]["cuda_init_s"]
    per_gpu_s = measured["seconds"] / len(measured["gpus"])  # the recorded run had no pairs
    gpu0 = measured["gpus"][0]
    staged_gbps = 1 / (1 / gpu0["d2h"]["median_gbps"] + 1 / gpu0["h2d"]["median_gbps"])
    fixed = fixed_costs(pair_path)
    pairs = gpus * (gpus - 1)
    same = same_numa_gpus * (same_numa_gpus - 1) * (gpus // same_numa_gpus)  # ordered pairs inside a node
    cross = pairs - same
    rates = {  # (unidirectional, bidirectional total) GB/s
        "public_same_numa": (53.0, 103.0), "public_cross_numa": (39.0, 64.0),
        "expectation_same_numa": (45.0, 45.0), "expectation_cross_numa": (35.0, 35.0),
        "staged_through_host": (staged_gbps, staged_gbps),
    }
    per_pair = {name: pair_seconds(method, nbytes, fixed, *rate) for name, rate in rates.items()}
    base = startup_s + gpus * per_gpu_s
    scenarios = {
        "public_numbers": base + same * per_pair["public_same_numa"] + cross * per_pair["public_cross_numa"],
        "at_expectations": base + same * per_pair["expectation_same_numa"]
        + cross * per_pair["expectation_cross_numa"],
        "p2p_unavailable_staged": base + pairs * per_pair["staged_through_host"],
    }
    return {
        "what": f"PROJECTION of the check's run time on {gpus} GPUs ({pairs} ordered pairs) from durations "
                "measured on one H200; not a measurement",
        "target_s": TARGET_S,
        "measured": {"startup_s": startup_s, "per_gpu_s": per_gpu_s, "pair_fixed_costs_s": fixed,
                     "check_total_s_one_gpu": check["timing"]["total_s"]},
        "assumed_rates_gbps": rates,
        "per_pair_s": per_pair,
        "ordered_pairs": {"same_numa": same, "cross_numa": cross},
        "projected_total_s": scenarios,
        "within_target": {name: total < TARGET_S for name, total in scenarios.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", type=Path, default=FIXTURES / "p2p.json")
    parser.add_argument("--pair-path", type=Path, default=FIXTURES / "pair_path.json")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--same-numa-gpus", type=int, default=4, help="GPUs per NUMA node")
    args = parser.parse_args()
    result = project(json.loads(args.check.read_text()), json.loads(args.pair_path.read_text()), args.gpus,
                     args.same_numa_gpus)
    print(json.dumps(result, indent=2))
    return 0 if all(result["within_target"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
