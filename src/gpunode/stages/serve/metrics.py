"""The server's own Prometheus metrics (``/metrics``, served only with ``--enable-metrics``), read
from inside its container: the node publishes the server's port on its own loopback, and the
server's image has python3, as sglang's does."""

from __future__ import annotations

from typing import Any

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

# Prints the HTTP status on the first line and the body after it (0 and the error when it fails).
READ = """
import sys, urllib.request, urllib.error
try:
    answer = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10)
    print(answer.status)
    print(answer.read().decode())
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print(0, type(e).__name__)
"""


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


def read(container: Any, port: int) -> tuple[int, str]:
    """(HTTP status, body) of the server's /metrics, asked from inside its container (status 0: no answer)."""
    result = container.exec_run(["python3", "-c", READ, str(port)])
    status, _, body = (result.output or b"").decode(errors="replace").partition("\n")
    head = status.split(" ", 1)[0]
    return (int(head) if head.isdigit() else 0), body


def server_in_flight(container: Any, port: int) -> int | None:
    """What the server holds now, by its own count; None when it has no metrics to say it (no
    --enable-metrics: 404), does not answer, or answers something that is not metrics."""
    status, body = read(container, port)
    if status != 200:
        return None
    try:
        return in_flight(body)
    except MetricsUnreadable:
        return None
