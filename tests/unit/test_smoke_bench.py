"""The bench_serving command line (pure), its result line, and the local runner with the stand-in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpunode.stages.smoke import bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes import SHIM  # noqa: E402 - tests/ put on the path just above
from fakes.process import fake_server, model_dir  # noqa: E402


def test_bench_command_is_the_documented_line() -> None:
    argv = bench.bench_command("http://127.0.0.1:30000", "glm-5", "/model", "/tmp/out.jsonl")
    assert argv == ["python3", "-m", "sglang.bench_serving", "--backend", "sglang",
                    "--base-url", "http://127.0.0.1:30000", "--model", "glm-5", "--tokenizer", "/model",
                    "--dataset-name", "random-ids", "--random-input-len", "64", "--random-output-len", "16",
                    "--random-range-ratio", "1.0", "--num-prompts", "8", "--max-concurrency", "4", "--request-rate", "inf",
                    "--output-file", "/tmp/out.jsonl"]
    assert bench.bench_env("k") == {"OPENAI_API_KEY": "k"} and bench.bench_env(None) == {}


def line(**fields: object) -> str:
    # bench_serving.py writes json.dumps(result): request_rate inf becomes Infinity.
    base = {"backend": "sglang", "request_rate": float("inf"), "completed": 8, "output_throughput": 100.0,
            "mean_ttft_ms": 20.0, "duration": 1.5, "server_info": {"api_key": "secret"}}
    return json.dumps({**base, **fields})


def test_verify_bench() -> None:
    ok, detail, kept = bench.verify_bench(bench.BenchRun(0, "", line() + "\n", 2.0))
    assert ok and detail == "8/8 requests, output 100.0 tok/s, mean TTFT 20 ms"
    assert kept["completed"] == 8 and "server_info" not in kept
    ok, detail, _ = bench.verify_bench(bench.BenchRun(0, "", line(completed=5), 2.0))
    assert not ok and detail == "3 of 8 requests failed"
    # Appended runs: the last line counts.
    assert bench.verify_bench(bench.BenchRun(0, "", line(completed=1) + "\n" + line(), 2.0))[0]
    ok, detail, _ = bench.verify_bench(bench.BenchRun(1, "x\nValueError: Warmup failed - ...\n", None, 2.0))
    assert not ok and "exited 1" in detail and "Warmup failed" in detail


def test_local_runner_runs_the_unchanged_command_line(tmp_path: Path) -> None:
    runner = bench.LocalBenchRunner(str(model_dir(tmp_path)), python=[sys.executable],
                                    extra_env={"PYTHONPATH": str(SHIM)})
    with fake_server(tmp_path, api_key="bench-key") as (_process, url):
        run = runner.run(lambda path: bench.bench_command(url, "glm-5", runner.tokenizer, path),
                         bench.bench_env("bench-key"), 60)
    assert run.returncode == 0, run.output_tail
    result = bench.last_result(run.jsonl)
    assert result is not None and result["completed"] == 8 and result["total_output_tokens"] == 8 * 16
    # The same field names bench_serving.py 0.5.9 writes.
    for name in ("duration", "request_throughput", "input_throughput", "output_throughput", "mean_ttft_ms",
                 "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_itl_ms",
                 "mean_e2e_latency_ms", "concurrency", "max_output_tokens_per_s", "server_info"):
        assert name in result
    assert result["server_info"]["api_key"] == "bench-key"  # why the report keeps only chosen fields


def test_local_runner_missing_tokenizer_and_timeout(tmp_path: Path) -> None:
    runner = bench.LocalBenchRunner(str(tmp_path / "nowhere"), python=[sys.executable],
                                    extra_env={"PYTHONPATH": str(SHIM)})
    with fake_server(tmp_path) as (_process, url):
        run = runner.run(lambda path: bench.bench_command(url, "glm-5", runner.tokenizer, path), {}, 60)
        assert run.returncode != 0 and "Can't load tokenizer" in run.output_tail and run.jsonl is None
        slow = bench.LocalBenchRunner(str(model_dir(tmp_path)), python=[sys.executable, "-c",
                                                                       "import time; time.sleep(60)"])
        late = slow.run(lambda path: ["python3", "--ignored"], {}, 0.5)
    assert late.returncode == 124 and "timed out" in late.output_tail
