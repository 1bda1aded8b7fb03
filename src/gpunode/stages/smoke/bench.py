"""The short load test: ``python3 -m sglang.bench_serving`` with ``random-ids`` prompts.

``bench_command`` builds the command line (pure). A runner executes it somewhere and hands back the
JSON line bench_serving appended to its ``--output-file``: ``DockerBenchRunner`` in a throw-away
container from the server's own image (the node has no sglang outside it), ``LocalBenchRunner``
as a local process (tests use it with a stand-in). The runner picks the output path, hence
``argv_for(path)``. The API key goes to bench_serving as OPENAI_API_KEY, which is what it reads
(bench_serving.py get_auth_headers); the output line's ``server_info`` holds the server's
arguments, API key included (http_server.py server_info), so the file is read and deleted, and
only the metrics below are kept.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MODULE = "sglang.bench_serving"
NUM_PROMPTS = 8
MAX_CONCURRENCY = 4
INPUT_LEN = 64
OUTPUT_LEN = 16
RANGE_RATIO = 1.0  # exact lengths: N in, M out
BENCH_TIMEOUT_S = 600.0
# What the report keeps of bench_serving's result line (field names as bench_serving.py writes them).
KEPT_FIELDS = ("completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
               "output_throughput", "total_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
               "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms", "max_concurrency")


class BenchUnavailable(Exception):
    """The runner itself cannot run (Docker unreachable, image missing): an environment problem."""


@dataclass(frozen=True)
class BenchRun:
    returncode: int
    output_tail: str  # the end of its stdout/stderr, for a failure's detail
    jsonl: str | None  # the output file's content, None when it wrote none
    seconds: float


ArgvFor = Callable[[str], list[str]]


class BenchRunner(Protocol):
    tokenizer: str  # where the model's tokenizer is, as the bench process sees it
    # Where the server is, as the bench process sees it; None: the URL the HTTP checks use. A bench
    # on the node reaches the server on the node's port, not through the checks' SSH forward.
    server_url: str | None

    def run(self, argv_for: ArgvFor, env: Mapping[str, str], timeout_s: float) -> BenchRun: ...


def bench_command(base_url: str, served_name: str, tokenizer: str, output_file: str, *,
                  num_prompts: int = NUM_PROMPTS, max_concurrency: int = MAX_CONCURRENCY,
                  input_len: int = INPUT_LEN, output_len: int = OUTPUT_LEN,
                  range_ratio: float = RANGE_RATIO) -> list[str]:
    """The bench_serving command line. ``random-ids`` needs no dataset download (``random`` would
    fetch ShareGPT); the tokenizer is the model's own, read from its local directory.
    ``--random-range-ratio`` is always given: bench_serving 0.5.9 defaults it to 0, which draws each
    request's lengths uniformly from [1, N] (bench_serving.py:1528-1533); 1.0 makes them exactly N."""
    return ["python3", "-m", MODULE, "--backend", "sglang", "--base-url", base_url, "--model", served_name,
            "--tokenizer", tokenizer, "--dataset-name", "random-ids",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", str(range_ratio),
            "--num-prompts", str(num_prompts), "--max-concurrency", str(max_concurrency),
            "--request-rate", "inf", "--output-file", output_file]


def bench_env(api_key: str | None) -> dict[str, str]:
    return {"OPENAI_API_KEY": api_key} if api_key else {}


def last_result(jsonl: str | None) -> dict[str, Any] | None:
    """The last JSON line (bench_serving appends one per run)."""
    if not jsonl:
        return None
    for line in reversed(jsonl.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def verify_bench(run: BenchRun, num_prompts: int = NUM_PROMPTS) -> tuple[bool, str, dict[str, Any]]:
    """Zero failed requests: bench_serving exited 0 and completed every prompt."""
    result = last_result(run.jsonl)
    if run.returncode != 0 or result is None:
        tail = " | ".join(line for line in run.output_tail.strip().splitlines()[-3:])
        return False, f"bench_serving exited {run.returncode} without a result line: {tail[-300:]}", {}
    kept = {key: result.get(key) for key in KEPT_FIELDS if key in result}
    completed = result.get("completed")
    if completed != num_prompts:
        failed = num_prompts - int(completed or 0)
        return False, f"{failed} of {num_prompts} requests failed", kept
    throughput = result.get("output_throughput")
    ttft = result.get("mean_ttft_ms")
    return True, (f"{completed}/{num_prompts} requests, output {throughput:.1f} tok/s, mean TTFT {ttft:.0f} ms"
                  if isinstance(throughput, (int, float)) and isinstance(ttft, (int, float))
                  else f"{completed}/{num_prompts} requests"), kept


def _text(part: str | bytes | None) -> str:
    if part is None:
        return ""
    return part if isinstance(part, str) else part.decode(errors="replace")


class LocalBenchRunner:
    """Run the command here; ``python`` replaces its leading ``python3`` (a venv, or a stand-in's
    interpreter), ``extra_env`` is added (e.g. a PYTHONPATH for a stand-in)."""

    server_url: str | None = None

    def __init__(self, tokenizer: str, python: Sequence[str] = ("python3",),
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.python = list(python)
        self.extra_env = dict(extra_env or {})

    def run(self, argv_for: ArgvFor, env: Mapping[str, str], timeout_s: float) -> BenchRun:
        with tempfile.TemporaryDirectory(prefix="gpunode-bench-") as folder:
            path = os.path.join(folder, "bench.jsonl")
            argv = argv_for(path)
            began = time.perf_counter()
            try:
                proc = subprocess.run(self.python + argv[1:], capture_output=True, text=True, timeout=timeout_s,
                                      check=False,
                                      env={**os.environ, **self.extra_env, **env})
            except FileNotFoundError as exc:
                raise BenchUnavailable(f"cannot run {self.python[0]}: {exc}") from exc
            except subprocess.TimeoutExpired as exc:
                tail = "".join(_text(part) for part in (exc.stdout, exc.stderr))
                return BenchRun(124, f"timed out after {timeout_s:.0f} s\n{tail[-2000:]}", None,
                                time.perf_counter() - began)
            jsonl = Path(path).read_text(encoding="utf-8") if os.path.exists(path) else None
            return BenchRun(proc.returncode, (proc.stdout + proc.stderr)[-2000:], jsonl, time.perf_counter() - began)


class DockerBenchRunner:
    """Run the command in a throw-away container from the server image, on the node's network
    (the server's port is published on the node), with the model directory read-only at /model
    for the tokenizer. The output file is read back with get_archive, so a remote daemon works."""

    OUTPUT = "/tmp/gpunode-bench.jsonl"
    tokenizer = "/model"

    def __init__(self, client: Any, image: str, model_dir: str, network_mode: str = "host",
                 server_url: str | None = None) -> None:
        self.client = client
        self.image = image
        self.model_dir = model_dir
        self.network_mode = network_mode
        self.server_url = server_url

    def run(self, argv_for: ArgvFor, env: Mapping[str, str], timeout_s: float) -> BenchRun:
        import docker
        from docker.types import Mount

        began = time.perf_counter()
        try:
            container = self.client.containers.create(
                image=self.image, command=argv_for(self.OUTPUT), environment={"HF_HUB_OFFLINE": "1", **env},
                network_mode=self.network_mode, labels={"io.gpunode.role": "sglang-bench"},
                mounts=[Mount(target=self.tokenizer, source=self.model_dir, type="bind", read_only=True)])
        except docker.errors.DockerException as exc:
            raise BenchUnavailable(f"cannot create the bench container from {self.image}: {exc}") from exc
        try:
            container.start()
            try:
                status = container.wait(timeout=timeout_s)
                code = int(status.get("StatusCode", 1))
            except (docker.errors.DockerException, OSError):  # requests' ReadTimeout is an OSError
                # the wait timed out: stop it and report it like a timeout
                container.kill()
                code = 124
            tail = container.logs(stdout=True, stderr=True, tail=40).decode(errors="replace")
            return BenchRun(code, tail, self._read_output(container), time.perf_counter() - began)
        except docker.errors.DockerException as exc:
            raise BenchUnavailable(f"the bench container failed to run: {exc}") from exc
        finally:
            container.remove(force=True)

    def _read_output(self, container: Any) -> str | None:
        import docker

        try:
            chunks, _stat = container.get_archive(self.OUTPUT)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle:
                    return handle.read().decode("utf-8", errors="replace")
        return None
