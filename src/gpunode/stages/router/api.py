"""What gpunode asks of a running sglang-router (0.3.2), over HTTP, and of its workers.

The router's own endpoints, as it answers them (measured against the real router in the lab):
``GET /health`` (200 "OK"), ``GET /workers`` ({"workers": [{"id", "url", "model_id", "is_healthy",
...}], "total"}), ``POST /workers`` {"url", "api_key"} (202: registration queued in the background),
``DELETE /workers/{id}``; with ``--api-key`` every one but /health, /v1/models needs
``Authorization: Bearer <key>``. A worker posted without "api_key" gets none, even when the router
has one (the router warns "Adding worker ... without API key while router has API key
configured"): its /server_info and /model_info then answer 401, the router lists its model as
"unknown", and /v1/models lists "unknown" beside the served name. Its Prometheus metrics count
each worker's upstream calls (``smg_worker_cb_outcomes_total{worker, outcome}``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import requests

from gpunode.ground.metrics import by_label
from gpunode.ground.redact import redact

TIMEOUT_S = 10.0
# smg_worker_cb_outcomes_total{worker="http://10.0.3.10:30000",outcome="success"} 4
OUTCOMES = "smg_worker_cb_outcomes_total"


class RouterUnavailable(Exception):
    """The router did not answer (or refused) a request; the message says which and how."""


@dataclass(frozen=True)
class RouterWorker:
    id: str
    url: str
    healthy: bool
    model_id: str = ""


class RouterApi:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.trust_env = False  # loopback through an SSH forward: never a proxy
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            return self.session.request(method, self.base_url + path, timeout=self.timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise RouterUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/health").status_code == 200
        except RouterUnavailable:
            return False

    def wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return True
            time.sleep(0.5)
        return self.healthy()

    def workers(self) -> list[RouterWorker]:
        reply = self._call("GET", "/workers")
        if reply.status_code != 200:
            raise RouterUnavailable(f"GET /workers: HTTP {reply.status_code}: {reply.text[:200]}")
        return [RouterWorker(str(w["id"]), str(w["url"]), bool(w.get("is_healthy")), str(w.get("model_id") or ""))
                for w in reply.json().get("workers", [])]

    def add_worker(self, url: str, api_key: str | None) -> None:
        """Register a worker; ``api_key`` is what the router sends it (the fleet's one key)."""
        body: dict[str, str] = {"url": url}
        if api_key:
            body["api_key"] = api_key
        reply = self._call("POST", "/workers", json=body)
        if reply.status_code not in (200, 201, 202):
            # A router may echo what it was sent: hidden first, then cut (a cut key would not match).
            said = redact(reply.text, [api_key] if api_key else [])[:200]
            raise RouterUnavailable(f"POST /workers {url}: HTTP {reply.status_code}: {said}")

    def remove_worker(self, worker: RouterWorker) -> None:
        reply = self._call("DELETE", f"/workers/{worker.id}")
        if reply.status_code not in (200, 202, 204):
            raise RouterUnavailable(f"DELETE /workers/{worker.id} ({worker.url}): HTTP {reply.status_code}")

    def wait_listed(self, urls: set[str], healthy: bool, timeout_s: float) -> set[str]:
        """Poll until every url is registered (and healthy, if asked); returns those that are."""
        deadline = time.monotonic() + timeout_s
        while True:
            known = {w.url for w in self.workers() if w.healthy or not healthy}
            if urls <= known or time.monotonic() > deadline:
                return urls & known
            time.sleep(1.0)

    def wait_gone(self, urls: set[str], timeout_s: float) -> set[str]:
        """Poll until none of urls is registered (removals are queued); returns those still there."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = urls & {w.url for w in self.workers()}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


def worker_requests(metrics_text: str) -> dict[str, int]:
    """Requests the router sent to each worker (its upstream calls, successful or not), from its
    Prometheus metrics."""
    return {url: int(value) for url, value in by_label(metrics_text, OUTCOMES, "worker").items()}


def read_metrics(url: str) -> str:
    try:
        reply = requests.get(url, timeout=TIMEOUT_S, proxies={"http": "", "https": ""})
    except requests.RequestException as exc:
        raise RouterUnavailable(f"GET {url}: {type(exc).__name__}: {exc}") from None
    if reply.status_code != 200:
        raise RouterUnavailable(f"GET {url}: HTTP {reply.status_code}")
    return reply.text


# Run inside the router container: GET a worker's /health from the router's own network; prints the
# status, or 0 (or the HTTP code) with the error's kind and reason.
PROBE = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] + '/health', timeout=5).status)
except Exception as e:
    print(getattr(e, 'code', 0), type(e).__name__, getattr(e, 'reason', e))
"""


def probe_answer(output: str) -> tuple[bool, str]:
    """(answers 200, what the worker answered in words) from PROBE's output."""
    said = output.strip().splitlines()
    last = said[-1].strip() if said else ""
    if last == "200":
        return True, "answers /health"
    code, _, why = last.partition(" ")
    if not last:
        return False, "does not answer (the probe printed nothing)"
    return False, (f"answers /health with HTTP {code}" if code not in ("0", "") else f"does not answer: {why}")
