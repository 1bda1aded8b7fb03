"""``gpunode.bench.command.bench`` end to end against the SGLang stand-in (tests/fakes): the sweep,
the JSON lines, the report, the comparison, the A/B with restarts, and the exit codes."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gpunode.bench import command, sweep
from gpunode.bench.command import bench, parse_ab
from gpunode.bench.sampler import SampleSet
from gpunode.stages.smoke import bench as smoke_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes import SHIM  # noqa: E402 - tests/ put on the path just above
from fakes.ports import closed_port  # noqa: E402
from fakes.process import fake_server, model_dir  # noqa: E402

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "h200_sampler_load.json"
FLAG = "--moe-runner-backend"


def recorded_phase(name: str | None = None) -> SampleSet:
    """A phase of the H200 recording with its clock restarted at 0, as a level's samples would be."""
    data = json.loads(RECORDING.read_text())
    whole = SampleSet.from_json(data["sample_set"])
    if name is None:
        return whole
    bounds = next(p for p in data["phases"] if p["name"] == name)
    part = whole.window(bounds["t0"], bounds["t1"])
    part.samples = [dataclasses.replace(s, t=round(s.t - bounds["t0"], 4)) for s in part.samples]
    part.pcie = [dataclasses.replace(p, t=round(p.t - bounds["t0"], 4)) for p in part.pcie]
    return part


class ReplaySampler:
    """Hands back a recorded set for every level."""

    def __init__(self, data: SampleSet) -> None:
        self.data = data
        self.starts = 0
        self.stops = 0

    def start(self) -> None:
        self.starts += 1

    def stop(self) -> SampleSet:
        self.stops += 1
        return SampleSet.from_json(self.data.to_json())


def runner_for(tmp: Path) -> smoke_bench.LocalBenchRunner:
    return smoke_bench.LocalBenchRunner(str(model_dir(tmp)), python=[sys.executable],
                                        extra_env={"PYTHONPATH": str(SHIM)})


def read_lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with fake_server(tmp_path, api_key="bench-key") as (_process, url):
        yield url


def test_sweep_writes_a_line_per_level_and_the_report(tmp_path: Path, server: str) -> None:
    out, results = io.StringIO(), tmp_path / "results"
    sampler = ReplaySampler(recorded_phase("small_gemm_graph"))
    code = bench(server, "glm-5", [1, 2, 4], 16, 8, runner_for(tmp_path), sampler, None, None, None, results,
                 api_key="bench-key", allreduce_us=13.0, out=out)
    assert code == command.EXIT_OK, out.getvalue()
    assert sampler.starts == sampler.stops == 3
    lines = read_lines(results)
    assert [line["gpunode"]["concurrency"] for line in lines] == [1, 2, 4]
    for line in lines:
        ours = line["gpunode"]
        # bench_serving's own line, as 0.5.9 writes it ...
        assert line["completed"] == 32 and line["max_concurrency"] == ours["concurrency"]
        assert line["random_input_len"] == 16 and line["total_output_tokens"] == 32 * 8
        assert {"output_throughput", "p99_ttft_ms", "p99_tpot_ms", "median_tpot_ms"} <= set(line)
        # ... with the server's API key out of it, and our fields beside it.
        assert line["server_info"]["api_key"] == "***" and line["server_info"]["tokenizer_path"]
        assert ours["num_prompts"] == 32 and ours["ok"] and ours["failed_requests"] == 0 and ours["error"] is None
        assert ours["schema"] == sweep.SCHEMA and ours["url"] == server and ours["variant"] is None
        assert ours["gpu"]["finding_kind"] == "busy-low-power"  # the recorded small-GEMM phase
        assert (results / ours["samples_file"]).is_file()
    everything = "".join(path.read_text() for path in results.rglob("*") if path.suffix in (".jsonl", ".md", ".json"))
    assert "bench-key" not in everything
    report = (results / "report.md").read_text()
    assert "| 4 | 32 | 0 |" in report and "% of TDP: small GEMMs, not saturated tensor cores" in report
    assert "GPU sampling: NVML every 0.1 s on 1 GPU(s) (NVIDIA H200), driver 580.159.04." in report
    assert "**192 tok/s**" in report and "above the computed ceiling" in report  # the stand-in is fast
    summary = json.loads((results / "summary.json").read_text())
    assert summary["roofline"]["ceiling_tok_s"] == pytest.approx(192.4, abs=0.2) and summary["failed"] is False
    assert summary["roofline"]["context_tokens"] == 16 + 8 // 2
    assert "bench: c=4: 32/32 requests" in out.getvalue()


def test_plots(tmp_path: Path, server: str) -> None:
    import matplotlib  # noqa: F401 - declared (the bench extra): a broken install fails, never skips
    results = tmp_path / "results"
    code = bench(server, "glm-5", [1, 2], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("large_gemm")),
                 None, None, None, results, api_key="bench-key", out=io.StringIO())
    assert code == 0
    for name in ("throughput.png", "power.png"):
        assert (results / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name[:-4]}]({name})" in (results / "report.md").read_text()


def test_without_nvml_the_sweep_still_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with fake_server(tmp_path) as (_process, url):
        code = bench(url, "glm-5", [2], 16, 8, runner_for(tmp_path), None, None, None, None, results,
                     out=io.StringIO())
    assert code == 0
    (line,) = read_lines(results)
    gpu = line["gpunode"]["gpu"]
    assert not gpu["available"] and gpu["finding_kind"] == "unavailable" and "NVML" in gpu["reason"]
    report = (results / "report.md").read_text()
    assert "GPU sampling: unavailable (NVML" in report and "the sweep ran without it" in report
    assert "power plot without curves: no power reading" in report or "plots skipped" in report
    if (results / "power.png").exists():  # matplotlib installed: the file is there, saying why it is empty
        assert "![power](power.png)" in report


def test_lengths_are_exact_by_default_and_drawn_with_a_ratio(tmp_path: Path) -> None:
    """bench_serving draws each request's lengths from [max(int(N*r), 1), N]; gpunode passes r=1.0
    unless told otherwise, so 64 in / 16 out means exactly that, and the report says which."""
    exact, drawn = tmp_path / "exact", tmp_path / "drawn"
    with fake_server(tmp_path) as (_process, url):
        assert bench(url, "glm-5", [2], 64, 16, runner_for(tmp_path), None, None, None, None, exact,
                     out=io.StringIO()) == 0
        assert bench(url, "glm-5", [2], 64, 16, runner_for(tmp_path), None, None, None, None, drawn,
                     out=io.StringIO(), range_ratio=0.5) == 0
    (one,) = read_lines(exact)
    prompts = one["gpunode"]["num_prompts"]
    assert one["gpunode"]["range_ratio"] == 1.0 and one["random_range_ratio"] == 1.0
    # What the server produced (completion_tokens) and what it was sent: every request exactly N and M.
    assert (one["total_input_tokens"], one["total_output_tokens"]) == (prompts * 64, prompts * 16)
    assert "exactly 64 tokens in and 16 out per request (--random-range-ratio 1.0)" in (exact / "report.md").read_text()
    (two,) = read_lines(drawn)
    assert prompts * 32 <= two["total_input_tokens"] < prompts * 64 and prompts * 8 <= two["total_output_tokens"] < prompts * 16
    assert "drawn per request, uniformly: 32-64 tokens in and 8-16 out" in (drawn / "report.md").read_text()
    assert json.loads((drawn / "summary.json").read_text())["settings"]["range_ratio"] == 0.5


def test_a_range_ratio_outside_0_1_is_bad_input(tmp_path: Path) -> None:
    code = bench("http://127.0.0.1:1", "glm-5", [2], 64, 16, runner_for(tmp_path), None, None, None, None,
                 tmp_path / "r", out=io.StringIO(), range_ratio=1.5)
    assert code == 2


def test_the_gpu_window_is_the_timed_run(tmp_path: Path) -> None:
    """Only the last ``duration`` (+1 s) of a level's samples count: of the whole 28 s recording that
    is its idle tail, not the GEMM phases that a runner's start-up would stand for."""
    results = tmp_path / "results"
    with fake_server(tmp_path) as (_process, url):
        bench(url, "glm-5", [4], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase()), None, None, None,
              results, out=io.StringIO())
    (line,) = read_lines(results)
    ours = line["gpunode"]
    start, end = ours["gpu_window_s"]
    assert end == pytest.approx(28.043) and end - start == pytest.approx(line["duration"] + 1.0, abs=1e-3)
    assert ours["gpu"]["finding_kind"] == "idle" and ours["gpu"]["ticks"] <= 20


def test_failed_requests_fail_the_level(tmp_path: Path) -> None:
    results, out = tmp_path / "results", io.StringIO()
    with fake_server(tmp_path, env={"FAKE_SGLANG_FAULTS": "generate_flaky"}) as (_process, url):
        code = bench(url, "glm-5", [2], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")),
                     None, None, None, results, out=out)
    assert code == command.EXIT_FAILED
    (line,) = read_lines(results)
    ours = line["gpunode"]
    assert not ours["ok"] and ours["failed_requests"] > 0 and ours["error"] == f"{ours['failed_requests']} of 32 requests failed"
    assert f"**{ours['failed_requests']} of 32 requests failed**" in (results / "report.md").read_text()
    assert "FAILED" in out.getvalue()


def test_no_result_line_fails_the_level(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with fake_server(tmp_path, env={"FAKE_SGLANG_FAULTS": "generate_error"}) as (_process, url):
        code = bench(url, "glm-5", [1, 2], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")),
                     None, None, None, results, out=io.StringIO())
    assert code == command.EXIT_FAILED
    lines = read_lines(results)
    assert len(lines) == 2  # a failed level does not stop the sweep
    assert "Warmup failed" in lines[0]["gpunode"]["error"] and "output_throughput" not in lines[0]
    assert lines[0]["gpunode"]["gpu"]["finding_kind"] == "idle"  # whole set: no duration to window by


class Unavailable:
    tokenizer = "/model"
    server_url = None

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv_for: Any, env: Mapping[str, str], timeout_s: float) -> smoke_bench.BenchRun:
        self.calls += 1
        raise smoke_bench.BenchUnavailable("Docker at the default socket is unreachable")


def test_a_runner_that_cannot_run_is_an_environment_problem(tmp_path: Path) -> None:
    runner, results = Unavailable(), tmp_path / "results"
    with closed_port() as port:  # nothing answers there
        code = bench(f"http://127.0.0.1:{port}", "glm-5", [1, 2, 4], 16, 8, runner,
                     ReplaySampler(recorded_phase("idle")), None, None, None, results, out=io.StringIO())
    assert code == command.EXIT_ENVIRONMENT and runner.calls == 1
    (line,) = read_lines(results)
    assert "could not run: Docker at the default socket is unreachable" in line["gpunode"]["error"]


def test_a_regression_against_the_baseline(tmp_path: Path) -> None:
    fast, slow, out = tmp_path / "fast", tmp_path / "slow", io.StringIO()
    with fake_server(tmp_path, env={"FAKE_SGLANG_TOKEN_S": "0.001"}) as (_process, url):
        assert bench(url, "glm-5", [4], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")), None,
                     None, None, fast, out=io.StringIO()) == 0
    with fake_server(tmp_path, env={"FAKE_SGLANG_TOKEN_S": "0.012"}) as (_process, url):
        code = bench(url, "glm-5", [4], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")), None,
                     None, fast / "results.jsonl", slow, out=out)
    assert code == command.EXIT_FAILED
    assert "bench: REGRESSION at c=4" in out.getvalue()
    summary = json.loads((slow / "summary.json").read_text())
    assert summary["comparison"]["regressions"] == [[None, 4]]
    (level,) = summary["comparison"]["levels"]
    deltas = {d["metric"]: d for d in level["deltas"]}
    assert deltas["output_throughput"]["regressed"] and deltas["output_throughput"]["change"] < -0.5
    assert deltas["p99_tpot_ms"]["regressed"]
    report = (slow / "report.md").read_text()
    assert f"## Against `{fast / 'results.jsonl'}`" in report and "**REGRESSION**: output tok/s" in report
    assert "**1 level(s) regressed.**" in report
    # The same file as its own baseline regresses nowhere.
    with fake_server(tmp_path) as (_process, url):
        again = bench(url, "glm-5", [8], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")), None,
                      None, slow / "results.jsonl", tmp_path / "other", out=io.StringIO())
    assert again == 0
    assert "Not in the baseline: concurrency 8." in (tmp_path / "other" / "report.md").read_text()


class FakeRestarts:
    """``restart(flag_overrides) -> url`` starting the stand-in once per value, with a speed per value."""

    def __init__(self, tmp: Path, speeds: Mapping[str, str], broken: frozenset[str] = frozenset()) -> None:
        self.tmp = tmp
        self.speeds = speeds
        self.broken = broken
        self.calls: list[dict[str, Any]] = []
        self.stack = ExitStack()

    def __call__(self, overrides: dict[str, Any]) -> str:
        self.calls.append(dict(overrides))
        self.stack.close()
        self.stack = ExitStack()
        value = overrides.get(FLAG)
        if value in self.broken:
            raise RuntimeError("the server exited: torch.OutOfMemoryError (CUDA out of memory)")
        env = {"FAKE_SGLANG_TOKEN_S": self.speeds.get(value, "0.001")} if value else {}
        extra = [FLAG, value] if value else []
        _process, url = self.stack.enter_context(fake_server(self.tmp, env=env, extra_args=extra))
        return str(url)

    def close(self) -> None:
        self.stack.close()


def test_ab_restarts_once_per_value_and_puts_the_sweeps_side_by_side(tmp_path: Path) -> None:
    # 10x apart, so that the change stays far past the thresholds on a loaded machine.
    restarts = FakeRestarts(tmp_path, {"flashinfer_cutlass": "0.001", "flashinfer_cutedsl": "0.01"})
    results, out = tmp_path / "results", io.StringIO()
    try:
        code = bench(None, "glm-5", [1, 4], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")),
                     restarts, f"{FLAG}=flashinfer_cutlass,flashinfer_cutedsl", None, results, out=out)
    finally:
        restarts.close()
    assert code == 0, out.getvalue()
    assert restarts.calls == [{FLAG: "flashinfer_cutlass"}, {FLAG: "flashinfer_cutedsl"}, {}]
    lines = read_lines(results)
    assert [(line["gpunode"]["variant"], line["gpunode"]["concurrency"]) for line in lines] == [
        ("flashinfer_cutlass", 1), ("flashinfer_cutlass", 4), ("flashinfer_cutedsl", 1), ("flashinfer_cutedsl", 4)]
    assert all(line["gpunode"]["ab_flag"] == FLAG for line in lines)
    assert lines[0]["gpunode"]["url"] != lines[2]["gpunode"]["url"]  # a fresh server per value
    ab = json.loads((results / "summary.json").read_text())["ab"]
    assert ab["flag"] == FLAG and ab["values"] == ["flashinfer_cutlass", "flashinfer_cutedsl"]
    for row in ab["rows"]:
        # 5 ms per token against 1 ms: cutedsl is slower at every level, and the table says by how much.
        assert row["changes"]["flashinfer_cutedsl"]["output_throughput"] < -0.3
        assert row["changes"]["flashinfer_cutedsl"]["p99_tpot_ms"] > 1.0
    report = (results / "report.md").read_text()
    assert f"## A/B: `{FLAG}` = `flashinfer_cutlass`, `flashinfer_cutedsl`" in report
    assert "output tok/s: flashinfer_cutedsl vs flashinfer_cutlass" in report
    assert report.index("## A/B") < report.index("## Levels with")
    assert f"## Levels with `{FLAG} flashinfer_cutedsl`" in report
    assert "after the A/B the server was restarted with the host file's flags" in report
    assert "bench: restarting the server with --moe-runner-backend flashinfer_cutedsl" in out.getvalue()


def test_ab_restart_failure_is_a_failure_and_the_rest_runs(tmp_path: Path) -> None:
    restarts = FakeRestarts(tmp_path, {}, broken=frozenset({"flashinfer_cutedsl"}))
    results = tmp_path / "results"
    try:
        code = bench(None, "glm-5", [2], 16, 8, runner_for(tmp_path), ReplaySampler(recorded_phase("idle")),
                     restarts, "moe-runner-backend=flashinfer_cutedsl,flashinfer_cutlass", None, results,
                     restore=False, out=io.StringIO())
    finally:
        restarts.close()
    assert code == command.EXIT_FAILED
    assert restarts.calls == [{FLAG: "flashinfer_cutedsl"}, {FLAG: "flashinfer_cutlass"}]  # no restore asked
    assert [line["gpunode"]["variant"] for line in read_lines(results)] == ["flashinfer_cutlass"]
    assert "restart with --moe-runner-backend flashinfer_cutedsl failed: the server exited" in \
        (results / "report.md").read_text()


@pytest.mark.parametrize(("args", "message"), [
    ({"url": "localhost:30000"}, "the URL must be http(s)://host:port"),
    ({"served_name": " "}, "the served model name is empty"),
    ({"levels": []}, "no concurrency level given"),
    ({"levels": [1, 0]}, "a concurrency level must be an integer from 1 to 100000, got 0"),
    ({"levels": [4, 4]}, "a concurrency level is given twice"),
    ({"input_len": 0}, "input_len must be an integer from 1 to 200000, got 0"),
    ({"ab": f"{FLAG}=a,b"}, "--ab needs a way to restart the server"),
    ({"ab": f"{FLAG}=a", "restart": lambda o: "http://x:1"}, "--ab needs at least two different values"),
    ({"baseline": "missing.jsonl"}, "the baseline: cannot read"),
    ({"p2p_json": "missing.json"}, "the P2P file:"),
    ({"allreduce_us": -1.0}, "the all-reduce latency must be positive"),
])
def test_bad_input_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: dict[str, Any],
                                message: str) -> None:
    class Never:
        tokenizer = "/model"

        def run(self, *a: Any) -> Any:
            raise AssertionError("nothing may run on bad input")

    call: dict[str, Any] = {"url": "http://127.0.0.1:30000", "served_name": "glm-5", "levels": [1], "input_len": 16,
                            "output_len": 8, "runner": Never(), "sampler": ReplaySampler(recorded_phase("idle")),
                            "restart": None, "ab": None, "baseline": None, "out_dir": tmp_path / "results"}
    extra = {k: v for k, v in args.items() if k in ("allreduce_us", "p2p_json")}
    call.update({k: (tmp_path / v if k in ("baseline", "p2p_json") else v) for k, v in args.items() if k not in extra})
    extra = {k: (tmp_path / v if k == "p2p_json" else v) for k, v in extra.items()}
    assert bench(**call, **extra, out=io.StringIO()) == command.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_baseline_that_is_not_ours_and_a_file_as_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"completed": 8}\n')
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = bench("http://127.0.0.1:30000", "glm-5", [1], 16, 8, Unavailable(), None, None, None, other, blocker,
                 out=io.StringIO())
    assert code == 2
    err = capsys.readouterr().err
    assert "not a 'gpunode bench' level line" in err and f"the results folder {blocker} is a file" in err


def test_parse_ab_and_defaults() -> None:
    assert parse_ab("--moe-runner-backend=flashinfer_cutlass, flashinfer_cutedsl") == command.AbSpec(
        FLAG, ("flashinfer_cutlass", "flashinfer_cutedsl"))
    assert parse_ab("max-running-requests=64,1024").flag == "--max-running-requests"
    for bad in ("moe-runner-backend", "=a,b", "--port=1,2", "--Bad_Flag=a,b", "--x=a,,b", "--x=a,a"):
        with pytest.raises(ValueError):
            parse_ab(bad)
    assert command.profile_defaults("glm5-nvfp4-sm120") == ((1, 10, 64, 256, 1024), 256, 128)
    assert [sweep.num_prompts_for(c) for c in (1, 8, 9, 64, 1024)] == [32, 32, 36, 256, 4096]
    assert sweep.redact({"api_key": "k", "admin_api_key": None, "hf_token": "t", "tokenizer_path": "/m",
                         "max_total_tokens": 5, "nested": [{"ssl_keyfile_password": "p"}]}) == {
        "api_key": "***", "admin_api_key": None, "hf_token": "***", "tokenizer_path": "/m", "max_total_tokens": 5,
        "nested": [{"ssl_keyfile_password": "***"}]}


def test_production_restart_overrides_the_host_files_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve_restart``: run_serve with server.flags overridden; the URL from the host file."""
    from gpunode import derive, hostfile
    from gpunode.bench import restart as restart_mod
    from gpunode.stages.serve import command as serve_command

    host = hostfile.load(Path(__file__).resolve().parents[2] / "inventory" / "example" / "host.yml").hosts[0]
    host = restart_mod.overridden(host, {"--max-running-requests": 512})
    seen: list[Any] = []

    def fake_run_serve(target: Any, image_tag: str, docker_url: Any, console: Any, timeout_s: float) -> Any:
        seen.append(derive.server_launch(target))
        fails = "--moe-runner-backend" in target.server.flags and target.server.flags["--moe-runner-backend"] == "bad"
        return serve_command.ServeOutcome(1 if fails else 0, messages=["the server exited"] if fails else [])

    monkeypatch.setattr(serve_command, "run_serve", fake_run_serve)
    restart = restart_mod.serve_restart(host, "gpunode/sglang:test", None, None)
    assert restart({FLAG: "flashinfer_cutedsl"}) == f"http://127.0.0.1:{host.server.port}"
    assert seen[-1].value_of(FLAG) == "flashinfer_cutedsl"
    assert seen[-1].value_of("--max-running-requests") == "512"  # the host file's own override kept
    restart({})
    assert seen[-1].value_of(FLAG) == "flashinfer_cutlass"  # the profile's value again
    with pytest.raises(restart_mod.RestartFailed, match="did not become ready \\(exit 1\\): the server exited"):
        restart({FLAG: "bad"})


def test_the_package_imports_light() -> None:
    """It runs in the server image or on a bare node: no torch, matplotlib, pydantic or docker on import."""
    import subprocess

    code = ("import sys, gpunode.bench.command, gpunode.bench.restart; "
            "print(sorted(m for m in ('matplotlib', 'torch', 'pydantic', 'docker', 'yaml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
