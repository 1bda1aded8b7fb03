"""The sweep: one ``sglang.bench_serving`` run per concurrency level while the sampler samples every
GPU, each level one JSON line.

A level's line is bench_serving's own result line (its field names, as 0.5.9 writes them) with
``server_info`` redacted (it carries the server's ``api_key``: sglang's /server_info dumps all its
arguments), plus our fields under ``"gpunode"``:

``schema``, ``variant`` and ``ab_flag`` (A/B runs), ``concurrency``, ``num_prompts``, ``input_len``,
``output_len``, ``range_ratio`` (bench_serving's ``--random-range-ratio``: 1.0 exact lengths), ``url``, ``served_name``, ``started_at`` (UTC), ``wall_s`` (the runner's, container
start and tokenizer load included), ``returncode``, ``ok``, ``failed_requests``, ``error``, ``gpu``
(the level's ``summary.GpuLevelSummary``: mean and peak power as a share of the limit, utilisation,
the finding), ``gpu_window_s`` (the samples' time span it covers) and ``samples_file`` (the raw samples, relative to the results folder).

The GPU summary covers the benchmark's own window: bench_serving's ``duration`` (the timed run
after its warm-up) counted back from when the runner returned, plus ``WINDOW_SLACK_S`` before it.
The runner's start (a container, importing sglang, loading the tokenizer) and the warm-up request
would otherwise count as idle GPU time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpunode.bench import summary
from gpunode.bench.sampler import Sampler, SampleSet
from gpunode.stages.smoke import bench as smoke_bench

SCHEMA = "gpunode.bench.level/1"
MIN_PROMPTS = 32
PROMPTS_PER_CONCURRENCY = 4
LEVEL_TIMEOUT_S = 3600.0  # 4096 prompts x 128 tokens at ~1600 tok/s is ~330 s; slow backends take longer
WINDOW_SLACK_S = 1.0
# A key is secret when one of its underscore-separated words is one of these: api_key, admin_api_key,
# hf_token, ssl_keyfile_password; not tokenizer_path or max_total_tokens.
SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd"})
# bench_serving's metrics the report and the comparison read.
METRICS = ("completed", "duration", "request_throughput", "output_throughput", "total_throughput",
           "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "mean_e2e_latency_ms")


def num_prompts_for(concurrency: int) -> int:
    """Enough prompts for a stable figure: every slot refilled four times, never fewer than 32."""
    return max(PROMPTS_PER_CONCURRENCY * concurrency, MIN_PROMPTS)


def is_secret(key: Any) -> bool:
    return bool(SECRET_WORDS & set(str(key).lower().replace("-", "_").split("_")))


def redact(value: Any) -> Any:
    """``server_info`` with every secret key's value replaced, at any depth."""
    if isinstance(value, dict):
        return {k: ("***" if is_secret(k) and v not in (None, "", False) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


@dataclass
class SweepSettings:
    url: str
    served_name: str
    input_len: int
    output_len: int
    levels: Sequence[int]
    range_ratio: float = smoke_bench.RANGE_RATIO
    api_key: str | None = None
    timeout_s: float = LEVEL_TIMEOUT_S
    variant: str | None = None  # the A/B value this sweep runs with
    ab_flag: str | None = None


@dataclass
class Level:
    """One level's outcome: the JSON line and the raw samples."""

    line: dict[str, Any]
    samples: SampleSet
    environment: str = ""  # set when the runner could not run at all (BenchUnavailable)

    @property
    def ours(self) -> dict[str, Any]:
        result: dict[str, Any] = self.line["gpunode"]
        return result

    @property
    def ok(self) -> bool:
        return bool(self.ours.get("ok"))


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def samples_name(variant: str | None, concurrency: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in (variant or "sweep"))
    return f"samples/{safe}-c{concurrency}.json"


def run_level(runner: smoke_bench.BenchRunner, sampler: Sampler, settings: SweepSettings, concurrency: int,
              *, clock: Callable[[], float] = time.monotonic) -> Level:
    prompts = num_prompts_for(concurrency)
    ours: dict[str, Any] = {
        "schema": SCHEMA, "variant": settings.variant, "ab_flag": settings.ab_flag, "concurrency": concurrency,
        "num_prompts": prompts, "input_len": settings.input_len, "output_len": settings.output_len,
        "range_ratio": settings.range_ratio,
        "url": settings.url, "served_name": settings.served_name, "started_at": _utc(),
        "wall_s": None, "returncode": None, "ok": False, "failed_requests": None, "error": None,
        "gpu": None, "gpu_window_s": None, "samples_file": None,
    }

    def argv_for(path: str) -> list[str]:
        return smoke_bench.bench_command(settings.url, settings.served_name, runner.tokenizer, path,
                                         num_prompts=prompts, max_concurrency=concurrency,
                                         input_len=settings.input_len, output_len=settings.output_len,
                                         range_ratio=settings.range_ratio)

    sampler.start()
    began = clock()
    environment = ""
    run: smoke_bench.BenchRun | None = None
    try:
        run = runner.run(argv_for, smoke_bench.bench_env(settings.api_key), settings.timeout_s)
    except smoke_bench.BenchUnavailable as exc:
        environment = str(exc)
    finally:
        ended = clock()
        samples = sampler.stop()
    result = smoke_bench.last_result(run.jsonl) if run is not None else None
    line: dict[str, Any] = {}
    if result is not None:
        line = {k: (redact(v) if k == "server_info" else v) for k, v in result.items() if k != "gpunode"}
    ours["wall_s"] = round(run.seconds if run is not None else ended - began, 3)
    if run is not None:
        ours["returncode"] = run.returncode
    completed = result.get("completed") if result is not None else None
    if environment:
        ours["error"] = f"the benchmark could not run: {environment}"
    elif run is None or run.returncode != 0 or result is None:
        tail = " | ".join((run.output_tail if run else "").strip().splitlines()[-3:])
        ours["error"] = f"bench_serving exited {run.returncode if run else '?'} without a result line: {tail[-300:]}"
    else:
        failed = prompts - int(completed or 0)
        ours["failed_requests"] = failed
        ours["ok"] = failed == 0
        if failed:
            ours["error"] = f"{failed} of {prompts} requests failed"
    # The GPU window: the timed run, counted back from the runner's return (module docstring); the
    # sampler stopped right after it, so its duration marks that moment on the samples' clock.
    duration = result.get("duration") if result is not None else None
    window = samples
    if samples.available and isinstance(duration, (int, float)) and 0 < duration + WINDOW_SLACK_S < samples.duration_s:
        end_t = samples.duration_s
        window = samples.window(end_t - duration - WINDOW_SLACK_S, end_t + 1.0)
        ours["gpu_window_s"] = [round(end_t - duration - WINDOW_SLACK_S, 3), round(end_t, 3)]
    ours["gpu"] = summary.summarise(window).to_json()
    line["gpunode"] = ours
    return Level(line=line, samples=samples, environment=environment)


@dataclass
class Sweep:
    settings: SweepSettings
    levels: list[Level] = field(default_factory=list)
    environment: str = ""

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [level.line for level in self.levels]


def run_sweep(runner: smoke_bench.BenchRunner, sampler: Sampler, settings: SweepSettings,
              on_level: Callable[[Level], None] | None = None) -> Sweep:
    """Every level in order; stops early only when the runner cannot run at all."""
    sweep = Sweep(settings)
    for concurrency in settings.levels:
        level = run_level(runner, sampler, settings, concurrency)
        sweep.levels.append(level)
        if on_level is not None:
            on_level(level)
        if level.environment:
            sweep.environment = level.environment
            break
    return sweep


def write_line(path: Path, line: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
