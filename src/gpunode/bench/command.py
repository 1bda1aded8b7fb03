"""``gpunode bench``: the sweep (or the A/B), the GPU summaries, the comparison, the report.

``bench(...)`` writes into ``out_dir``:

- ``results.jsonl``: one line per level (per A/B value), written as each level ends;
- ``samples/<variant>-c<level>.json``: the raw NVML samples of each level;
- ``report.md``, ``throughput.png``, ``power.png``;
- ``summary.json``: the comparison, the A/B table and the roofline as data.

Exit codes:

== =====================================================================================
0  every level completed every request, and none regressed against the baseline
1  a level failed (bench_serving failed, or some requests failed), a restart for the A/B
   failed, or a level is more than 10 % worse than in the baseline
2  bad input (nothing was run): URL, served name, levels, lengths, ``--ab``, the baseline
   or P2P file, the results folder
4  environment: the benchmark runner could not run at all (Docker unreachable, image
   missing), and nothing else failed
== =====================================================================================
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

from gpunode.ground import exitcodes
from gpunode.bench import compare, report, roofline
from gpunode.bench import sweep as sweep_mod
from gpunode.bench.sampler import Sampler, SampleSet, open_sampler
from gpunode.stages.smoke.bench import BenchRunner

EXIT_OK = exitcodes.OK
EXIT_FAILED = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_ENVIRONMENT = exitcodes.ENVIRONMENT
DEFAULT_LEVELS = (1, 10, 64, 256, 1024)  # the seeds' MoE backend comparison (FIELD-NOTES s5)
DEFAULT_INPUT_LEN = 256  # FIELD-NOTES s6's bench_serving line
DEFAULT_OUTPUT_LEN = 128
MAX_LEN = 200_000  # GLM-5's context is 202752 tokens
RESERVED_FLAGS = ("--host", "--port", "--api-key")  # the restart's URL and key come from the host file
# Ready A/B pairs (gpunode bench --ab attention). attention: FlashInfer's MLA is what runs attention on
# SM120 with 0.5.9 (FIELD-NOTES s8), Triton's MLA the alternative that also runs there; moe: the
# seeds' comparison (seed 001: 1603 vs 797 output tok/s at concurrency 1024).
# stacks: the seeds' proven stack against the current one, each with its own image and profile.
STACK_KEY = "image.stack"  # the one host-file key --ab varies besides server flags
AB_PRESETS = {"attention": "--attention-backend=flashinfer,triton",
              "moe": "--moe-runner-backend=flashinfer_cutlass,flashinfer_cutedsl",
              "stacks": f"{STACK_KEY}=sglang-0.5.9-cu128,sglang-0.5.23-cu130"}

FlagValue = str | int | float | bool | None
Restart = Callable[[dict[str, FlagValue]], str]


@dataclass(frozen=True)
class AbSpec:
    flag: str
    values: tuple[str, ...]


def parse_ab(text: str) -> AbSpec:
    """``KEY=V1,V2[,...]``: ``--moe-runner-backend=flashinfer_cutlass,flashinfer_cutedsl``; the
    leading ``--`` may be left out. At least two distinct values. ``image.stack=A,B`` varies the
    stack instead: each value restarts the server from that stack's image with its profile."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--ab must be KEY=V1,V2, got {text!r}")
    if key == STACK_KEY:
        from gpunode.catalogue import stacks

        unknown = [value.strip() for value in rest.split(",") if value.strip() not in stacks.available()]
        if unknown:
            raise ValueError(f"--ab {STACK_KEY}: unknown stack {', '.join(unknown)} (known: {', '.join(stacks.available())})")
    flag = key if key.startswith("--") or key == STACK_KEY else f"--{key}"
    if flag != STACK_KEY and not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
        raise ValueError(f"--ab: {key!r} is not a long server flag like --moe-runner-backend")
    if flag in RESERVED_FLAGS:
        raise ValueError(f"--ab: {flag} cannot be varied (the host file's server settings own it)")
    values = tuple(value.strip() for value in rest.split(","))
    if any(not value for value in values):
        raise ValueError(f"--ab: an empty value in {rest!r}")
    if len(values) < 2 or len(set(values)) != len(values):
        raise ValueError(f"--ab needs at least two different values, got {rest!r}")
    return AbSpec(flag, values)


def profile_defaults(profile_name: str) -> tuple[tuple[int, ...], int, int]:
    """(levels, input_len, output_len) from a profile's optional ``bench:`` mapping
    (``levels``, ``input_len``, ``output_len``), else the defaults here."""
    from importlib import resources

    import yaml

    path = resources.files("gpunode") / "profiles" / f"{profile_name}.yml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    section = raw.get("bench") or {}
    levels = tuple(int(level) for level in section.get("levels", DEFAULT_LEVELS))
    return levels, int(section.get("input_len", DEFAULT_INPUT_LEN)), int(section.get("output_len", DEFAULT_OUTPUT_LEN))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def input_problems(url: str | None, served_name: str, levels: Sequence[int], input_len: int, output_len: int,
                   ab: str | None, restart: Restart | None, out_dir: str | Path,
                   bandwidth_gbps: float, allreduce_us: float | None, tp_size: int,
                   range_ratio: float = 1.0) -> list[str]:
    problems = []
    if not isinstance(range_ratio, (int, float)) or isinstance(range_ratio, bool) or not 0 < range_ratio <= 1:
        problems.append(f"the range ratio must be above 0 and at most 1 (1.0: exact lengths), got {range_ratio!r}")
    if ab is None or url is not None:
        parsed = urlparse(url or "")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            problems.append(f"the URL must be http(s)://host:port, got {url!r}")
    if not served_name or not served_name.strip():
        problems.append("the served model name is empty")
    if not levels:
        problems.append("no concurrency level given")
    for level in levels:
        if not _positive_int(level) or level > 100_000:
            problems.append(f"a concurrency level must be an integer from 1 to 100000, got {level!r}")
    if len(set(levels)) != len(levels):
        problems.append(f"a concurrency level is given twice: {list(levels)}")
    for name, value in (("input_len", input_len), ("output_len", output_len)):
        if not _positive_int(value) or value > MAX_LEN:
            problems.append(f"{name} must be an integer from 1 to {MAX_LEN}, got {value!r}")
    if ab is not None:
        try:
            parse_ab(ab)
        except ValueError as exc:
            problems.append(str(exc))
        if restart is None:
            problems.append("--ab needs a way to restart the server (none given)")
    if not isinstance(bandwidth_gbps, (int, float)) or not bandwidth_gbps > 0:
        problems.append(f"the memory bandwidth must be positive GB/s, got {bandwidth_gbps!r}")
    if allreduce_us is not None and (not isinstance(allreduce_us, (int, float)) or not allreduce_us > 0):
        problems.append(f"the all-reduce latency must be positive microseconds, got {allreduce_us!r}")
    if not _positive_int(tp_size):
        problems.append(f"the tensor-parallel size must be a positive integer, got {tp_size!r}")
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        problems.append(f"the results folder {folder} is a file")
    return problems


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def describe_level(line: dict[str, Any]) -> str:
    ours = line["gpunode"]
    name = f"{ours['variant']} c={ours['concurrency']}" if ours.get("variant") else f"c={ours['concurrency']}"
    gpu = ours.get("gpu") or {}
    if ours.get("error") and line.get("output_throughput") is None:
        return f"bench: {name}: FAILED: {ours['error']}"
    text = (f"bench: {name}: {line.get('completed')}/{ours['num_prompts']} requests, output "
            f"{line.get('output_throughput', 0):.1f} tok/s, TTFT p99 {line.get('p99_ttft_ms', 0):.0f} ms, "
            f"TPOT p99 {line.get('p99_tpot_ms', 0):.1f} ms")
    if ours.get("error"):
        text += f"; FAILED: {ours['error']}"
    if "workers" in ours:
        text += "; per worker: " + ", ".join(f"{name} {count}" for name, count in sorted(ours["workers"].items()))
    return text + f"; GPU: {gpu.get('finding') or '-'}"


def sampling_text(samples: SampleSet | None) -> str:
    if samples is None:
        return "no level ran"
    if not samples.available:
        return f"unavailable ({samples.reason}); the sweep ran without it"
    names = sorted({gpu.name for gpu in samples.gpus})
    text = (f"NVML every {samples.interval_s:g} s on {len(samples.gpus)} GPU(s) ({', '.join(names)})"
            + (f", driver {samples.driver_version}" if samples.driver_version else ""))
    refused = sorted({key.split(".", 1)[-1] for key in samples.unsupported})
    if refused:
        text += f"; not supported here, recorded as empty: {', '.join(refused)}"
    return text


Workers = Callable[[], dict[str, int]]  # requests sent to each worker so far (a router's counters)


class _Run:
    """One invocation: the results folder, the lines so far, what went wrong."""

    def __init__(self, folder: Path, out: TextIO, workers: Workers | None = None) -> None:
        self.folder = folder
        self.out = out
        self.workers = workers
        self.counted = workers() if workers else {}
        self.results = folder / "results.jsonl"
        self.lines: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.failed = False
        self.environment = ""
        self.first_samples: SampleSet | None = None
        (folder / "samples").mkdir(parents=True, exist_ok=True)
        self.results.write_text("", encoding="utf-8")

    def on_level(self, level: sweep_mod.Level) -> None:
        ours = level.ours
        name = sweep_mod.samples_name(ours.get("variant"), ours["concurrency"])
        (self.folder / name).write_text(json.dumps(level.samples.to_json()), encoding="utf-8")
        ours["samples_file"] = name
        if self.workers is not None:
            counted = self.workers()
            ours["workers"] = {url: counted.get(url, 0) - self.counted.get(url, 0) for url in counted}
            self.counted = counted
        if self.first_samples is None or (not self.first_samples.available and level.samples.available):
            self.first_samples = level.samples
        sweep_mod.write_line(self.results, level.line)
        self.lines.append(level.line)
        if level.environment:
            self.environment = level.environment
        elif not level.ok:
            self.failed = True
        _say(self.out, describe_level(level.line))

    def sweep(self, runner: BenchRunner, sampler: Sampler, settings: sweep_mod.SweepSettings) -> None:
        result = sweep_mod.run_sweep(runner, sampler, settings, self.on_level)
        if result.environment:
            self.notes.append(f"the benchmark runner could not run: {result.environment}")


def _single_stream(lines: list[dict[str, Any]]) -> tuple[float | None, str]:
    """Decode tok/s of one stream: 1000 / median TPOT at concurrency 1 (the first variant that has it)."""
    for line in lines:
        ours = line["gpunode"]
        tpot = line.get("median_tpot_ms")
        if ours["concurrency"] == 1 and isinstance(tpot, (int, float)) and tpot > 0:
            where = f" with {ours['ab_flag']} {ours['variant']}" if ours.get("variant") else ""
            return 1000.0 / tpot, f"1000 / median TPOT {tpot:.1f} ms at concurrency 1{where}"
    return None, ""


def bench(url: str | None, served_name: str, levels: Sequence[int] | None, input_len: int | None,
          output_len: int | None, runner: BenchRunner, sampler: Sampler | None, restart: Restart | None,
          ab: str | None, baseline: str | Path | None, out_dir: str | Path, *,
          api_key: str | None = None, tp_size: int = 8, bandwidth_gbps: float = roofline.RTX_PRO_6000_GBPS,
          allreduce_us: float | None = None, p2p_json: str | Path | None = None,
          timeout_s: float = sweep_mod.LEVEL_TIMEOUT_S, restore: bool = True, out: TextIO | None = None,
          range_ratio: float = 1.0, workers: Workers | None = None) -> int:
    """Run the sweep against ``url`` (or, with ``ab``, once per value after ``restart``), write the
    results and the report into ``out_dir``, return the exit code (module docstring).

    ``levels``/``input_len``/``output_len`` default to the seeds' 1, 10, 64, 256, 1024 and 256/128
    (see ``profile_defaults`` for a profile's own). ``sampler`` None samples through NVML when it
    starts here. ``restart(flag_overrides) -> url`` restarts the server with the host file's
    server.flags overridden; after an A/B it is called with ``{}`` to put the host file's flags back
    (``restore``). ``allreduce_us`` or ``p2p_json`` (a ``gpunode p2p --json`` file) give the
    all-reduce latency for the roofline. ``range_ratio``: bench_serving's ``--random-range-ratio``;
    1.0 (the default) sends exactly ``input_len`` in and ``output_len`` out per request.
    ``workers``: through a router, its per-worker request counters, read around each level; the
    report puts each level's share per worker beside its totals.
    """
    out = out or sys.stdout
    levels = list(DEFAULT_LEVELS if levels is None else levels)
    input_len = DEFAULT_INPUT_LEN if input_len is None else input_len
    output_len = DEFAULT_OUTPUT_LEN if output_len is None else output_len
    problems = input_problems(url, served_name, levels, input_len, output_len, ab, restart, out_dir,
                              bandwidth_gbps, allreduce_us, tp_size, range_ratio)
    earlier: list[dict[str, Any]] | None = None
    p2p: dict[str, Any] | None = None
    if baseline is not None:
        try:
            earlier = compare.load_results(baseline)
        except compare.ResultFileError as exc:
            problems.append(f"the baseline: {exc}")
    if p2p_json is not None:
        try:
            p2p = roofline.load_p2p(p2p_json)
        except (OSError, ValueError) as exc:
            problems.append(f"the P2P file: {exc}")
    folder = Path(out_dir)
    if not problems:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problems.append(f"cannot create the results folder {folder}: {exc.strerror or exc}")
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT

    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sampler = sampler if sampler is not None else open_sampler()
    run = _Run(folder, out, workers)
    spec = parse_ab(ab) if ab is not None else None
    base = dict(served_name=served_name, input_len=input_len, output_len=output_len, levels=levels,
                range_ratio=range_ratio, api_key=api_key, timeout_s=timeout_s)
    if spec is None:
        assert url is not None
        run.sweep(runner, sampler, sweep_mod.SweepSettings(url=url, **base))  # type: ignore[arg-type]
    else:
        assert restart is not None
        _ab(run, spec, restart, runner, sampler, base, restore)

    comparison = None
    if earlier is not None:
        comparison = compare.compare(run.lines, earlier, str(baseline))
        for level in comparison.regressions:
            name = f"{level.variant} c={level.concurrency}" if level.variant else f"c={level.concurrency}"
            _say(out, f"bench: REGRESSION at {name} against {baseline}: {level.worst()}")
        if comparison.regressions:
            run.failed = True
    table = compare.ab_table(run.lines, spec.flag, list(spec.values)) if spec is not None else None
    measured, source = _single_stream(run.lines)
    line = roofline.compute(tp=tp_size, bandwidth_gbps=bandwidth_gbps, context_tokens=input_len + output_len // 2,
                            allreduce_us=allreduce_us, p2p=p2p, measured_tok_s=measured, measured_source=source)
    plots, skipped = report.plot(run.lines, folder)
    if skipped:
        run.notes.append(skipped)
    settings = {"input_len": input_len, "output_len": output_len, "range_ratio": range_ratio,
                "lengths": lengths_text(input_len, output_len, range_ratio),
                "url": url if spec is None else "(restarted per value)",
                "served_name": served_name, "started_at": started, "sampling": sampling_text(run.first_samples)}
    text = report.markdown(report.ReportInput(title=f"gpunode bench: {served_name}", lines=run.lines,
                                              settings=settings, ab=table, comparison=comparison, roofline=line,
                                              plots=plots, notes=run.notes))
    (folder / "report.md").write_text(text, encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({
        "settings": settings, "levels": len(run.lines), "failed": run.failed, "environment": run.environment,
        "comparison": comparison.to_json() if comparison else None, "ab": table.to_json() if table else None,
        "roofline": line.to_json(), "notes": run.notes}, indent=2), encoding="utf-8")
    for roof in roofline.describe(line):
        _say(out, "bench: roofline: " + roof.replace("**", ""))
    _say(out, f"bench: report {folder / 'report.md'}, results {run.results}")
    if run.failed:
        return EXIT_FAILED
    if run.environment:
        return EXIT_ENVIRONMENT
    return EXIT_OK


def lengths_text(input_len: int, output_len: int, range_ratio: float) -> str:
    """What each request really asks for, as bench_serving draws it (bench_serving.py:1528-1533)."""
    if range_ratio >= 1:
        return f"exactly {input_len} tokens in and {output_len} out per request (--random-range-ratio 1.0)"

    def low(n: int) -> int:
        return max(int(n * range_ratio), 1)

    return (f"drawn per request, uniformly: {low(input_len)}-{input_len} tokens in and {low(output_len)}-"
            f"{output_len} out (--random-range-ratio {range_ratio})")


def _ab(run: _Run, spec: AbSpec, restart: Restart, runner: BenchRunner, sampler: Sampler,
        base: dict[str, Any], restore: bool) -> None:
    for value in spec.values:
        _say(run.out, f"bench: restarting the server with {spec.flag} {value}")
        try:
            url = restart({spec.flag: value})
        except Exception as exc:  # the restart's own error (a diagnosis, a timeout) is the finding
            run.failed = True
            run.notes.append(f"restart with {spec.flag} {value} failed: {exc}; its sweep did not run")
            _say(run.out, f"bench: restart with {spec.flag} {value} FAILED: {exc}")
            continue
        run.sweep(runner, sampler, sweep_mod.SweepSettings(url=url, variant=value, ab_flag=spec.flag, **base))
        if run.environment:
            break
    if restore:
        _say(run.out, "bench: restarting the server with the host file's flags")
        try:
            url = restart({})
        except Exception as exc:
            run.failed = True
            run.notes.append(f"the server could not be put back to the host file's flags: {exc}")
            _say(run.out, f"bench: restoring the server FAILED: {exc}")
        else:
            run.notes.append(f"after the A/B the server was restarted with the host file's flags ({url})")


__all__ = ["AB_PRESETS", "EXIT_BAD_INPUT", "EXIT_ENVIRONMENT", "EXIT_FAILED", "EXIT_OK", "AbSpec", "bench", "parse_ab",
           "profile_defaults"]
