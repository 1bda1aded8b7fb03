#!/usr/bin/env python3
"""The model stage's fetch throughput as a ratio of a plain HTTP client fetching the same files from
the same Hub in the same run (goal >= 0.9).

The Hub is the lab's stand-in (gpunode_lab.hub) in a process of its own on the loopback, serving a
checkpoint made by the real safetensors library (gpunode_lab.checkpoint). Each round fetches the whole
revision into an empty folder twice, in turn: with gpunode's fetch (gpunode.stages.model.fetch.converge:
the listing, the disk preflight, every file through huggingface_hub's http_get into a partial hashed
as it is written, moved into place, then the verify), with a plain client on the same HTTP stack
(httpx: streamed GETs to disk, the same number at once, no hashing), with huggingface_hub's own
``snapshot_download`` and with curl (``--parallel``,
the same number of transfers at once). The rate of each is the revision's bytes over the wall time
until they are on the disk (gpunode's fetch fsyncs each file before it moves it into place; the plain
clients are followed by ``sync``, unless ``--page-cache``);
the ratio is gpunode's best round over the plain httpx client's best round (what gpunode adds to
the transfer); the ratios to curl say what the Python HTTP stack itself costs on the loopback.

    .venv/bin/python benchmarks/model_fetch.py [--shards 4] [--shard-mb 256] [--workers 2] [--rounds 3]

Prints JSON; exits 1 when the ratio misses the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 0.9
REPO = "bench/GLM-5-NVFP4"
DURABLE = True  # --page-cache: the plain clients' time without the final sync


def start_hub(root: Path) -> tuple[subprocess.Popen[str], str, str]:
    """The Hub in its own process (so that its serving does not share the client's interpreter)."""
    from gpunode_lab import hub

    proc = subprocess.Popen([sys.executable, hub.__file__, "--root", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    return proc, info["url"], info["repos"][REPO]


def with_gpunode(url: str, commit: str, dest: Path, workers: int) -> float:
    from gpunode.stages.model import fetch

    plan = fetch.Plan(repo=REPO, revision=commit, endpoint=url, weights_dir=dest / commit,
                      manifest=dest / f"{commit}.manifest.json", verify="sizes", workers=workers,
                      architecture="GlmMoeDsaForCausalLM", quantization={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    start = time.perf_counter()
    result = fetch.converge(plan, None, False, lambda line: None)
    seconds = time.perf_counter() - start
    if not result["verify"]["ok"]:
        raise SystemExit(f"gpunode's fetch did not verify: {result['verify']['findings'][:3]}")
    return seconds


def with_snapshot_download(url: str, commit: str, dest: Path, workers: int) -> float:
    """huggingface_hub's own fetch of the revision, as ``hf download --local-dir`` runs it."""
    from huggingface_hub import snapshot_download

    start = time.perf_counter()
    snapshot_download(REPO, revision=commit, endpoint=url, local_dir=dest, max_workers=workers, token=False)
    return _durable(start)


def with_curl(url: str, commit: str, names: list[str], dest: Path, workers: int) -> float:
    dest.mkdir(parents=True)
    argv = ["curl", "--silent", "--show-error", "--fail", "--location", "--parallel", "--parallel-max", str(workers)]
    for name in names:
        argv += ["--output", str(dest / name), f"{url}/{REPO}/resolve/{commit}/{name}"]
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return _durable(start)


def _durable(start: float) -> float:
    """The time until the files are on the disk, as gpunode's fetch holds them (fsync before each move):
    a plain client leaves its bytes in the page cache, which a 450 GB checkpoint does not fit in."""
    if DURABLE:
        os.sync()
    return time.perf_counter() - start


def with_httpx(url: str, commit: str, names: list[str], dest: Path, workers: int) -> float:
    """A plain client on the HTTP stack huggingface_hub runs on (httpx): streamed GETs written to disk,
    ``workers`` at a time, no hashing, no partials, no listing."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    dest.mkdir(parents=True)

    def get(client: httpx.Client, name: str) -> None:
        with client.stream("GET", f"{url}/{REPO}/resolve/{commit}/{name}") as response, open(dest / name, "wb") as out:
            response.raise_for_status()
            for chunk in response.iter_raw(1 << 20):
                out.write(chunk)

    start = time.perf_counter()
    with httpx.Client(follow_redirects=True, timeout=60) as client, ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda name: get(client, name), names))
    return _durable(start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=256)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--page-cache", action="store_true",
                        help="time the plain clients until their last byte is in the page cache, not on the disk")
    args = parser.parse_args(argv)
    global DURABLE
    DURABLE = not args.page_cache
    curl = shutil.which("curl") is not None  # the second baseline; the machine may lack it
    from gpunode_lab import checkpoint

    os.environ.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-fetch-") as tmp:
        root = Path(tmp)
        os.environ["HF_HOME"] = str(root / "hf-home")
        made = checkpoint.make(root / "hub" / REPO, shards=args.shards, shard_bytes=args.shard_mb << 20)
        names = sorted(made["files"])
        total = sum(made["files"].values())
        hub, url, commit = start_hub(root / "hub")
        try:
            rounds: dict[str, list[float]] = {"gpunode": [], "httpx": [], "snapshot_download": [],
                                              **({"curl": []} if curl else {})}
            for k in range(args.rounds):
                out = root / f"round{k}"
                if curl:
                    rounds["curl"].append(with_curl(url, commit, names, out / "curl", args.workers))
                rounds["httpx"].append(with_httpx(url, commit, names, out / "httpx", args.workers))
                rounds["snapshot_download"].append(with_snapshot_download(url, commit, out / "hf", args.workers))
                rounds["gpunode"].append(with_gpunode(url, commit, out / "gpunode", args.workers))
                shutil.rmtree(out)
        finally:
            hub.terminate()
            hub.wait(timeout=10)
    rate = {who: total / min(times) for who, times in rounds.items()}
    ratio = rate["gpunode"] / rate["httpx"]
    report: dict[str, Any] = {
        "files": len(names), "bytes": total, "workers": args.workers, "cores": os.cpu_count(),
        "baselines_until": "on disk (os.sync)" if DURABLE else "in the page cache", "rounds": rounds,
        **{f"{who}_MBps": round(r / 1e6, 1) for who, r in rate.items()},
        "ratio": round(ratio, 3), "ratio_to_snapshot_download": round(rate["gpunode"] / rate["snapshot_download"], 3),
        "ratio_to_curl": round(rate["gpunode"] / rate["curl"], 3) if curl else "curl is not installed here",
        "httpx_to_curl": round(rate["httpx"] / rate["curl"], 3) if curl else None, "goal": GOAL, "met": ratio >= GOAL,
        "note": "ratio: gpunode's fetch over a plain client on the same HTTP stack (httpx), the goal's measure of "
                "what gpunode adds (listing, preflight, partials, hashing every byte, fsync, verify); "
                "ratio_to_curl and httpx_to_curl: what the Python HTTP stack itself costs against curl"}
    print(json.dumps(report, indent=1))
    return 0 if report["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
