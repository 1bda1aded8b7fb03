"""``gpunode smoke --url URL``: prove a running SGLang server answers correctly.

Checks, in order: ``/health_generate`` 200; ``/v1/models`` lists the served name; a
temperature-0 question with a known answer (17 + 25 -> 42) with thinking off, which also shows no
``reasoning_content``; thinking on gives ``reasoning_content``; a forced tool call (name, JSON
arguments with the required keys, finish_reason "tool_calls"); the same three streamed (SSE deltas
assembled, ``data: [DONE]`` seen); and a short ``sglang.bench_serving`` run with no failed request.
The report carries each check's result and detail, TTFT and single-stream tokens/s, and the time
the smoke test itself added beyond waiting on the server (``overhead_s``).

Exit codes:

== ==================================================================================
0  every check passed (the bench may be skipped when no runner is given)
1  a check failed, or the server is not ready (the remaining checks are skipped)
2  bad input: the URL or served name
4  environment: the bench could not be run at all (Docker unreachable, image missing)
   and nothing else failed
== ==================================================================================
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import urlparse

from gpunode.ground import exitcodes
from gpunode.ground.result import CheckResult
from gpunode.stages.smoke import bench, checks
from gpunode.stages.smoke.client import Api, Reply, StreamReply
from gpunode.stages.smoke.report import SmokeReport, emit

EXIT_OK = exitcodes.OK
EXIT_FAILED = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_ENVIRONMENT = exitcodes.ENVIRONMENT
HEALTH_TIMEOUT_S = 30.0  # sglang's health generation may take up to its 20 s timeout
ORDER = ("health", "models", "answer", "reasoning_off", "reasoning_on", "tool_call", "stream_answer",
         "stream_reasoning", "stream_tool_call", "bench")


def input_problems(url: str, served_name: str) -> list[str]:
    problems = []
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        problems.append(f"--url must be http(s)://host:port, got {url!r}")
    if not served_name or not served_name.strip():
        problems.append("the served model name is empty")
    return problems


def _http_failure(reply: Reply | StreamReply) -> str:
    if reply.status is None:
        return reply.error or "no answer"
    return f"HTTP {reply.status}: {reply.text[:200]}"


class _Run:
    """One smoke run: the API, the results so far, and the numbers for the timings."""

    def __init__(self, api: Api, served_name: str) -> None:
        self.api = api
        self.served = served_name
        self.results: list[CheckResult] = []
        self.ttft_s: float | None = None
        self.decode_tok_s: float | None = None

    def add(self, name: str, ok: bool, detail: str, seconds: float = 0.0, **data: Any) -> None:
        self.results.append(CheckResult(name, "pass" if ok else "fail", detail, seconds, dict(data)))

    def skip_rest(self, why: str) -> None:
        done = {result.name for result in self.results}
        self.results.extend(CheckResult(name, "skip", why) for name in ORDER if name not in done)

    def health(self) -> bool:
        reply = self.api.get("/health_generate", timeout_s=HEALTH_TIMEOUT_S)
        ok = reply.status == 200
        self.add("health", ok, "200: a one-token generation came back" if ok
                 else f"server not ready: {_http_failure(reply)}", reply.seconds)
        return ok

    def models(self) -> None:
        reply = self.api.get("/v1/models")
        if reply.status != 200:
            self.add("models", False, _http_failure(reply), reply.seconds)
            return
        ok, detail = checks.verify_models(reply.body, self.served)
        self.add("models", ok, detail, reply.seconds)

    def chat(self, names: tuple[str, ...], body: dict[str, Any],
             verify: Callable[[dict[str, Any], str | None], list[tuple[bool, str]]]) -> None:
        """One non-streamed request judged by one or more checks (``names`` in step with ``verify``)."""
        reply = self.api.post("/v1/chat/completions", body)
        parsed = checks.first_choice(reply.body) if reply.status == 200 else _http_failure(reply)
        for index, name in enumerate(names):
            if isinstance(parsed, str):
                self.add(name, False, parsed, reply.seconds if index == 0 else 0.0)
                continue
            ok, detail = verify(*parsed)[index]
            self.add(name, ok, detail, reply.seconds if index == 0 else 0.0)

    def stream(self, name: str, body: dict[str, Any],
               verify: Callable[[checks.Assembled], tuple[bool, str]]) -> checks.Assembled | None:
        reply = self.api.stream("/v1/chat/completions", body)
        if reply.status != 200:
            self.add(name, False, _http_failure(reply), reply.seconds)
            return None
        assembled = checks.assemble(reply.events)
        problems = list(assembled.problems) + ([reply.error] if reply.error else [])
        if not reply.done:
            problems.append("the stream ended without 'data: [DONE]'")
        ok, detail = verify(assembled)
        if problems:
            ok, detail = False, "; ".join(problems + ([detail] if not ok else []))
        self.add(name, ok, f"{detail} ({assembled.chunks} chunks)", reply.seconds)
        return assembled

    def bench(self, runner: bench.BenchRunner | None, url: str, api_key: str | None) -> str:
        """The load test; returns an environment problem, if the runner could not run."""
        if runner is None:
            self.results.append(CheckResult("bench", "skip", "no bench runner given"))
            return ""
        try:
            target = runner.server_url or url
            run = runner.run(lambda path: bench.bench_command(target, self.served, runner.tokenizer, path),
                             bench.bench_env(api_key), bench.BENCH_TIMEOUT_S)
        except bench.BenchUnavailable as exc:
            self.results.append(CheckResult("bench", "skip", f"could not run: {exc}"))
            return str(exc)
        ok, detail, kept = bench.verify_bench(run)
        self.add("bench", ok, detail, run.seconds, **kept)
        return ""


def _streamed_answer(run: _Run) -> None:
    assembled = run.stream("stream_answer", checks.answer_body(run.served, stream=True),
                           lambda a: checks.verify_answer(a.message()))
    if assembled and assembled.first_delta_s is not None:
        run.ttft_s = assembled.first_delta_s


def _streamed_reasoning(run: _Run) -> None:
    assembled = run.stream("stream_reasoning", checks.reasoning_body(run.served, stream=True),
                           lambda a: checks.verify_reasoning_on(a.message()))
    if assembled:
        run.decode_tok_s = checks.decode_rate(assembled)


def run_checks(url: str, served_name: str, api_key: str | None,
               bench_runner: bench.BenchRunner | None) -> SmokeReport:
    began = time.perf_counter()
    api = Api(url, api_key)
    run = _Run(api, served_name)
    environment = ""
    if not run.health():
        run.skip_rest("the server is not ready")
    else:
        run.models()
        run.chat(("answer", "reasoning_off"), checks.answer_body(served_name, stream=False),
                 lambda message, _finish: [checks.verify_answer(message), checks.verify_reasoning_off(message)])
        run.chat(("reasoning_on",), checks.reasoning_body(served_name, stream=False),
                 lambda message, _finish: [checks.verify_reasoning_on(message)])
        run.chat(("tool_call",), checks.tool_body(served_name, stream=False),
                 lambda message, finish: [checks.verify_tool_calls(message.get("tool_calls"), finish)])
        _streamed_answer(run)
        _streamed_reasoning(run)
        run.stream("stream_tool_call", checks.tool_body(served_name, stream=True),
                   lambda a: checks.verify_tool_calls(a.tool_calls, a.finish_reason))
        environment = run.bench(bench_runner, url, api_key)
    total = time.perf_counter() - began
    bench_result = next((r for r in run.results if r.name == "bench"), None)
    bench_server_s = float(bench_result.data.get("duration") or 0.0) if bench_result else 0.0
    bench_wall_s = bench_result.seconds if bench_result else 0.0
    server_s = api.http_seconds + bench_server_s
    report = SmokeReport(url, served_name, run.results, {
        "total_s": total, "server_s": server_s, "http_s": api.http_seconds, "bench_wall_s": bench_wall_s,
        "bench_duration_s": bench_server_s, "overhead_s": max(0.0, total - server_s),
        "ttft_s": run.ttft_s, "decode_tok_s": run.decode_tok_s,
    })
    if any(result.failed for result in run.results):
        report.exit_code = EXIT_FAILED
    elif environment:
        report.exit_code, report.environment_problem = EXIT_ENVIRONMENT, environment
    return report


def smoke(url: str, served_name: str, api_key: str | None, bench_runner: bench.BenchRunner | None,
          as_json: bool, out: TextIO) -> int:
    """Run every check against ``url``, write the report to ``out``, return the exit code."""
    problems = input_problems(url, served_name)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = run_checks(url, served_name, api_key, bench_runner)
    emit(report, as_json, out)
    return report.exit_code
