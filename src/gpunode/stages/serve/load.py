"""What the server holds now, by its own count, read from inside its container (the node publishes
the server's port on its own loopback, and the server's image has python3, as sglang's does):

* ``/v1/loads`` (sglang 0.5.9 and 0.5.23, mounted whatever the flags, behind the API key): the
  scheduler's running and waiting requests, counted when asked (entrypoints/v1_loads.py; 0.5.9
  managers/scheduler_metrics_mixin.py:620-660, 0.5.23 scheduler_components/load_inquirer.py:109-112);
* else its Prometheus metrics (``/metrics``, only with ``--enable-metrics``).

The router's own per-worker gauge cannot say it: sglang-router 0.3.2 exports
``smg_worker_requests_active`` but leaves it at 0 while requests run (measured in the lab: four
1500-token requests in flight through it, the gauge 0 for both workers).
"""

from __future__ import annotations

import json
from typing import Any

from gpunode.derive.serverspec import API_KEY_FILE
from gpunode.ground.metrics import MetricsUnreadable, samples

# The HTTP middleware's live count of requests being answered, per endpoint (sglang 0.5.9
# srt/utils/common.py:1619-1624, a livesum gauge moved at each request's start and end; 0.5.23
# observability/http_request_metrics.py:40), and the scheduler's gauges of requests it holds (0.5.9
# srt/metrics/collector.py:306 and :354). The scheduler's are moved only when it logs its stats: on
# 0.5.9 they read the last busy count for up to 30 s after the last request (the stand-in's
# FAKE_SGLANG_METRICS_IDLE_S), so they are read only where the HTTP gauge is missing.
HTTP_ACTIVE = "sglang:http_requests_active"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
NOT_REQUESTS = ("/metrics", "/health", "/health_generate")  # the drain's own reads, and the router's health checks

# GETs a path of the server, with the key from the key file gpunode put in the container (none: no
# key); prints the HTTP status on the first line and the body after it (0 and the error when it fails).
READ = """
import json, sys, urllib.request, urllib.error
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}")
try:
    with open(sys.argv[3]) as held:
        request.add_header("Authorization", "Bearer " + json.load(held)["api-key"])
except OSError:
    pass
try:
    answer = urllib.request.urlopen(request, timeout=10)
    print(answer.status)
    print(answer.read().decode())
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print(0, type(e).__name__)
"""
LOADS = "/v1/loads?include=core"


def in_flight(text: str) -> int | None:
    """Requests the server is answering, from the metrics text (None: it exports no such gauge): the
    HTTP gauge's, less the scrape itself and health checks; else the scheduler's running and queued.
    Each TP rank may report its own scheduler series: a rank's count is the request count, so take
    the largest."""
    active = samples(text, HTTP_ACTIVE)
    if active:
        return int(sum(value for labels, value in active if labels.get("endpoint") not in NOT_REQUESTS))
    running, queued = samples(text, RUNNING), samples(text, QUEUED)
    if not running and not queued:
        return None
    return int(max((value for _labels, value in running), default=0) + max((value for _labels, value in queued), default=0))


def read(container: Any, port: int, path: str = "/metrics") -> tuple[int, str]:
    """(HTTP status, body) of the server's ``path``, asked from inside its container with the key it
    holds (status 0: no answer)."""
    result = container.exec_run(["python3", "-c", READ, str(port), path, API_KEY_FILE])
    status, _, body = (result.output or b"").decode(errors="replace").partition("\n")
    head = status.split(" ", 1)[0]
    return (int(head) if head.isdigit() else 0), body


def loads_in_flight(body: str) -> int | None:
    """Running and waiting requests of every scheduler, from /v1/loads' answer (None: not that answer)."""
    try:
        loads = json.loads(body)["loads"]
        return sum(int(load["num_running_reqs"]) + int(load["num_waiting_reqs"]) for load in loads)
    except (ValueError, KeyError, TypeError):
        return None


def server_in_flight(container: Any, port: int) -> int | None:
    """What the server holds now, by its own count: /v1/loads, else its metrics; None when neither
    says it (no such endpoint, no --enable-metrics, no answer, or an answer of another shape)."""
    status, body = read(container, port, LOADS)
    if status == 200 and (count := loads_in_flight(body)) is not None:
        return count
    status, body = read(container, port)
    if status != 200:
        return None
    try:
        return in_flight(body)
    except MetricsUnreadable:
        return None
