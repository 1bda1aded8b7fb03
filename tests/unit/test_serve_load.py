"""What a drain reads of what a server holds (gpunode.stages.serve.load), against the stand-in server,
which answers /v1/loads and /metrics as sglang 0.5.9 and 0.5.23 do (tests/unit/test_standin_metrics.py):
its scheduler's running and waiting requests, with its key; its HTTP gauge without the scrape itself
where /v1/loads is missing; None where neither says it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpunode.ground.metrics import MetricsUnreadable, by_label, samples
from gpunode.stages.router.api import worker_requests
from gpunode.stages.serve import load as metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above


class LocalContainer:
    """``exec_run`` as Docker runs it in the server's container, here: the same program, this machine
    standing in for the container's network namespace (where the server's port is on loopback), and
    ``key_file`` for the key file gpunode puts in the container."""

    def __init__(self, key_file: Path | None = None) -> None:
        self.key_file = key_file

    def exec_run(self, argv: list[str]) -> Any:
        if self.key_file is not None:
            argv = [*argv[:-1], str(self.key_file)]
        done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=60)
        return SimpleNamespace(output=done.stdout + done.stderr, exit_code=done.returncode)


def _slow_generate(url: str, tokens: int, key: str) -> None:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": tokens}})
    request = urllib.request.Request(url + "/generate", data=body.encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    urllib.request.urlopen(request, timeout=60).read()


@pytest.mark.parametrize(("version", "flags"), [("0.5.9", []), ("0.5.23", []), ("0.5.9", ["--enable-metrics"])])
def test_the_servers_own_count_of_what_it_holds_rises_and_falls(tmp_path: Path, version: str,
                                                               flags: list[str]) -> None:
    """/v1/loads whatever the flags, read with the key the container holds (the stand-in, as sglang,
    answers it 401 without)."""
    env = {"FAKE_SGLANG_VERSION": version, "FAKE_SGLANG_TOKEN_S": "0.01"}
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps({"api-key": "the-fleet-key"}))
    with fake_server(tmp_path, env=env, api_key="the-fleet-key", extra_args=flags) as (_process, url):
        port = int(url.rsplit(":", 1)[1])
        container = LocalContainer(key_file)
        assert metrics.read(LocalContainer(tmp_path / "none.json"), port, metrics.LOADS)[0] == 401
        assert metrics.server_in_flight(container, port) == 0  # its own scrape is not counted
        requests = [threading.Thread(target=_slow_generate, args=(url, 400, "the-fleet-key")) for _ in range(2)]
        for thread in requests:
            thread.start()
        deadline = time.monotonic() + 30
        seen = 0
        while time.monotonic() < deadline and seen < 2:
            seen = max(seen, metrics.server_in_flight(container, port) or 0)
        assert seen == 2
        for thread in requests:
            thread.join(timeout=60)
        assert metrics.server_in_flight(container, port) == 0


def test_a_server_without_v1_loads_or_metrics_says_nothing_and_that_is_not_zero(tmp_path: Path) -> None:
    with fake_server(tmp_path) as (_process, url):
        port = int(url.rsplit(":", 1)[1])
        assert metrics.read(LocalContainer(), port)[0] == 404  # no --enable-metrics
    # An older server without /v1/loads and metrics: both 404.
    answers = iter([b"404\n", b"404\n"])
    older = SimpleNamespace(exec_run=lambda argv: SimpleNamespace(output=next(answers), exit_code=0))
    assert metrics.server_in_flight(older, 1) is None


def test_v1_loads_counts_running_and_waiting_of_every_scheduler() -> None:
    body = json.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1},
                                 {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 4}]})
    assert metrics.loads_in_flight(body) == 7
    assert metrics.loads_in_flight("{}") is None and metrics.loads_in_flight("not json") is None


def test_a_server_that_does_not_answer_is_unread() -> None:
    assert metrics.server_in_flight(SimpleNamespace(exec_run=lambda argv: SimpleNamespace(
        output=b"0 URLError\n", exit_code=0)), 1) is None


SCHEDULER_ONLY = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="glm-5",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="glm-5",tp_rank="1"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="glm-5",tp_rank="0"} 2.0
"""


def test_without_the_http_gauge_the_schedulers_running_and_queued_count_once_per_request() -> None:
    assert metrics.in_flight(SCHEDULER_ONLY) == 5  # each rank reports the same 3 running: counted once
    assert metrics.in_flight("# nothing\n") is None
    with pytest.raises(MetricsUnreadable):
        samples("this is { not metrics", "x")


# sglang-router 0.3.2's metrics as the lab's router printed them (tests/lab/test_fleet.py reads them live).
ROUTER = """# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://10.0.3.10:30000",outcome="success"} 4
smg_worker_cb_outcomes_total{worker="http://10.0.3.10:30000",outcome="failure"} 1
smg_worker_cb_outcomes_total{worker="http://10.0.3.12:30000",outcome="success"} 7
# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://10.0.3.12:30000"} 2
"""


def test_the_routers_counts_per_worker() -> None:
    assert worker_requests(ROUTER) == {"http://10.0.3.10:30000": 5, "http://10.0.3.12:30000": 7}
    assert by_label(ROUTER, "smg_worker_requests_active", "worker") == {"http://10.0.3.12:30000": 2.0}
    assert by_label(ROUTER, "smg_worker_requests_active", "nope") == {}
