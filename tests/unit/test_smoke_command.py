"""gpunode smoke against the fake SGLang 0.5.9 server: every check passing, each failure mode
named in its check's detail, bad input, an unusable bench runner, and the API key kept private."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.smoke import bench
from gpunode.stages.smoke.command import smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes import SHIM  # noqa: E402 - tests/ put on the path just above
from fakes.ports import closed_port  # noqa: E402
from fakes.process import fake_server, model_dir, wait_port  # noqa: E402

KEY = "smoke-key-0123456789"


def local_runner(tmp: Path) -> bench.LocalBenchRunner:
    """The stand-in bench_serving, run through the unchanged ``python3 -m sglang.bench_serving`` line."""
    return bench.LocalBenchRunner(str(model_dir(tmp)), python=[sys.executable], extra_env={"PYTHONPATH": str(SHIM)})


def run_smoke(url: str, runner: Any, api_key: str | None = None, served: str = "glm-5") -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = smoke(url, served, api_key, runner, True, out)
    return code, json.loads(out.getvalue())


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def test_every_check_passes_on_a_ready_server(tmp_path: Path) -> None:
    with fake_server(tmp_path, api_key=KEY) as (_process, url):
        out = io.StringIO()
        code = smoke(url, "glm-5", KEY, local_runner(tmp_path), True, out)
    text = out.getvalue()
    report = json.loads(text)
    assert code == 0 and report["ok"] and report["exit_code"] == 0
    checks = by_name(report)
    assert list(checks) == ["health", "models", "answer", "reasoning_off", "reasoning_on", "tool_call",
                            "stream_answer", "stream_reasoning", "stream_tool_call", "bench"]
    assert all(check["status"] == "pass" for check in checks.values()), checks
    assert checks["bench"]["data"]["completed"] == 8 and "server_info" not in checks["bench"]["data"]
    timings = report["timings"]
    assert timings["ttft_s"] > 0 and timings["decode_tok_s"] > 0
    assert timings["overhead_s"] < 10.0 and timings["total_s"] >= timings["server_s"]
    # The key is in sglang's /server_info, hence in bench_serving's output line: not in our report.
    assert KEY not in text


def test_text_report(tmp_path: Path) -> None:
    with fake_server(tmp_path) as (_process, url):
        out = io.StringIO()
        code = smoke(url, "glm-5", None, None, False, out)
    text = out.getvalue()
    assert code == 0
    assert "PASS  tool_call" in text and "SKIP  bench" in text and "no bench runner given" in text
    assert "result: PASS (9/10 checks passed)" in text and "TTFT" in text


@pytest.mark.parametrize(("fault", "check", "words"), [
    ("wrong_answer", "answer", "does not hold 42"),
    ("wrong_answer", "stream_answer", "does not hold 42"),
    ("no_reasoning", "reasoning_on", "reasoning_content is empty"),
    ("no_reasoning", "stream_reasoning", "reasoning_content is empty"),
    ("reasoning_when_off", "reasoning_off", "present with enable_thinking false"),
    ("tool_args_not_json", "tool_call", "arguments are not JSON"),
    ("tool_args_not_json", "stream_tool_call", "arguments are not JSON"),
    ("tool_wrong_name", "tool_call", "called 'other_function'"),
    ("tool_missing_key", "tool_call", "arguments lack city, unit"),
    ("tool_finish_stop", "tool_call", "finish_reason 'stop'"),
    ("tool_finish_stop", "stream_tool_call", "finish_reason 'stop'"),
    ("no_tool_call", "tool_call", "no tool_calls"),
    ("models_wrong_name", "models", "'glm-5' is not listed (listed: default)"),
    ("stream_no_done", "stream_answer", "without 'data: [DONE]'"),
    ("generate_error", "bench", "Warmup failed"),
    ("generate_flaky", "bench", "of 8 requests failed"),
])
def test_each_failure_is_named_in_its_check(tmp_path: Path, fault: str, check: str, words: str) -> None:
    with fake_server(tmp_path, env={"FAKE_SGLANG_FAULTS": fault}) as (_process, url):
        code, report = run_smoke(url, local_runner(tmp_path))
    found = by_name(report)[check]
    assert code == 1 and not report["ok"]
    assert found["status"] == "fail" and words in found["detail"], found


def test_server_not_ready_skips_the_rest(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_HEALTH": "never", "SGLANG_HEALTH_CHECK_TIMEOUT": "0.2"}
    with fake_server(tmp_path, env=env) as (_process, url):
        code, report = run_smoke(url, local_runner(tmp_path))
    checks = by_name(report)
    assert code == 1 and checks["health"]["status"] == "fail" and "HTTP 503" in checks["health"]["detail"]
    assert {c["status"] for name, c in checks.items() if name != "health"} == {"skip"}


def test_still_warming_up_is_not_ready(tmp_path: Path) -> None:
    with fake_server(tmp_path, env={"FAKE_SGLANG_WARMUP_S": "30"}, wait=False) as (process, url):
        wait_port(int(url.rsplit(":", 1)[1]), process=process)
        code, report = run_smoke(url, None)
    assert code == 1 and "server not ready: HTTP 503" in by_name(report)["health"]["detail"]


def test_nothing_listening(tmp_path: Path) -> None:
    with closed_port() as port:
        code, report = run_smoke(f"http://127.0.0.1:{port}", None)
    assert code == 1 and "cannot connect" in by_name(report)["health"]["detail"]


def test_wrong_or_missing_api_key_is_401(tmp_path: Path) -> None:
    with fake_server(tmp_path, api_key=KEY) as (_process, url):
        code, report = run_smoke(url, None, api_key="wrong")
    checks = by_name(report)
    assert code == 1 and checks["health"]["status"] == "pass"  # /health* needs no key (srt/utils/auth.py)
    assert checks["models"]["detail"].startswith("HTTP 401") and "Unauthorized" in checks["models"]["detail"]


def test_bad_input_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert smoke("localhost:30000", "glm-5", None, None, True, out) == 2
    assert smoke("http://127.0.0.1:30000", " ", None, None, True, out) == 2
    assert out.getvalue() == "" and "--url must be http(s)://host:port" in capsys.readouterr().err


class Unavailable:
    tokenizer = "/model"
    server_url = None

    def run(self, argv_for: Any, env: Mapping[str, str], timeout_s: float) -> bench.BenchRun:
        raise bench.BenchUnavailable("Docker is unreachable")


def test_bench_runner_that_cannot_run_is_an_environment_problem(tmp_path: Path) -> None:
    with fake_server(tmp_path) as (_process, url):
        code, report = run_smoke(url, Unavailable())
    assert code == 4 and report["environment_problem"] == "Docker is unreachable"
    assert by_name(report)["bench"]["status"] == "skip"
    with fake_server(tmp_path, env={"FAKE_SGLANG_FAULTS": "wrong_answer"}) as (_process, url):
        code, _report = run_smoke(url, Unavailable())
    assert code == 1  # a failed check outranks the environment


def test_bench_goes_to_the_runners_server_url(tmp_path: Path) -> None:
    # On a node the HTTP checks go through an SSH forward while the bench runs on the node itself:
    # the runner's server_url, not the checks' URL, is where the bench must go.
    with fake_server(tmp_path) as (_process, url), closed_port() as nowhere:
        elsewhere = local_runner(tmp_path)
        elsewhere.server_url = f"http://127.0.0.1:{nowhere}"  # nothing answers there
        code, report = run_smoke(url, elsewhere)
        assert code == 1 and by_name(report)["models"]["status"] == "pass"
        assert by_name(report)["bench"]["status"] == "fail"
        same = local_runner(tmp_path)
        same.server_url = url
        code, report = run_smoke(url.replace("127.0.0.1", "localhost"), same)
        assert code == 0, by_name(report)["bench"]
