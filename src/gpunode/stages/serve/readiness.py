"""Wait until an SGLang server is ready, showing its startup phases; fail fast when it dies.

Ready means ``/health_generate`` answered 200: in sglang 0.5.9 (entrypoints/http_server.py) that
endpoint answers 503 while the server is warming up and 200 only after a one-token generation has
come back. The port itself opens only after the weights are loaded, so a refused connection is
normal for most of a start. Progress comes from the log (``phases``), failure from the process
state: a server that exits, or that Docker restarts, is diagnosed from its log at once.

The server and the probe are small protocols so that the same loop watches a Docker container
(``docker_run.DockerServer``) and, in tests, a local process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import requests

from gpunode.stages.serve import phases
from gpunode.stages.serve.diagnose import Diagnosis, diagnose, match_signature, redact

POLL_S = 0.25  # how often state, log and health are read: readiness is noticed within ~1.3 s
HEALTH_PATH = "/health_generate"
# sglang's health handler waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for its generation.
HEALTH_REQUEST_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class ProcessState:
    running: bool  # up, not exited and not being restarted
    exit_code: int | None = None
    restarts: int = 0
    oom_killed: bool = False
    status: str = ""


class ServerHandle(Protocol):
    def state(self) -> ProcessState: ...
    def new_log_lines(self) -> list[str]: ...
    def log_text(self, tail: int = 400) -> str: ...


HealthProbe = Callable[[], int | None]  # the HTTP status of /health_generate, None when unreachable


class HttpHealthProbe:
    """GET {base_url}/health_generate; None when the port is closed or the request fails."""

    def __init__(self, base_url: str, timeout_s: float = HEALTH_REQUEST_TIMEOUT_S) -> None:
        self.url = base_url.rstrip("/") + HEALTH_PATH
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def __call__(self) -> int | None:
        try:
            return self.session.get(self.url, timeout=(1.0, self.timeout_s)).status_code
        except requests.RequestException:
            return None


@dataclass(frozen=True)
class PhaseEvent:
    phase: str
    at_s: float
    detail: str = ""

    def says(self) -> str:
        text = phases.BY_KEY[self.phase].says
        return f"{text} ({self.detail})" if self.detail else text


@dataclass
class Readiness:
    ready: bool
    phase: str
    elapsed_s: float
    events: list[PhaseEvent] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    exited: bool = False
    last_health: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"ready": self.ready, "phase": self.phase, "elapsed_s": round(self.elapsed_s, 3),
                "exited": self.exited, "last_health": self.last_health,
                "events": [{"phase": e.phase, "at_s": round(e.at_s, 3), "detail": e.detail} for e in self.events],
                "diagnosis": self.diagnosis.as_dict() if self.diagnosis else None}


def _timeout_diagnosis(phase: str, elapsed_s: float, log_text: str, secrets: Iterable[str]) -> Diagnosis:
    """Not ready in time and still running: a known signature in the log, else what the phase says."""
    found = match_signature(log_text)
    if found:
        signature, line = found
        return Diagnosis(signature.key, signature.title, signature.fix, redact(line, secrets)[:500])
    waited = f"after {elapsed_s:.0f} s"
    if phase == "container":
        return Diagnosis("no_progress", f"no SGLang startup line in the log {waited}",
                         "check the image and command (docker logs <container>); the first line SGLang prints is "
                         "its server_args", "")
    if phase == "distributed":
        return Diagnosis("nccl_init_hang", f"stuck in torch distributed / NCCL initialisation {waited}",
                         "run `gpunode p2p` on the node; set server.env NCCL_DEBUG: INFO, and NCCL_P2P_DISABLE: '1' "
                         "to confirm a P2P path problem", "")
    if phase == "loading":
        return Diagnosis("slow_load", f"still loading weights {waited}",
                         "the ~410-453 GB checkpoint must come off the node's disk: give serve a longer timeout, or "
                         "check the storage behind model.path", "")
    if phase in ("http", "fired_up"):
        failed = "Health check failed" in log_text
        return Diagnosis("no_generation", f"the port is open but no generation comes back {waited}"
                         + (" (SGLang logged 'Health check failed')" if failed else ""),
                         "the scheduler stopped answering: run `gpunode p2p` (a hung all-reduce looks like this) "
                         "and read docker logs <container> for the scheduler's last lines", "")
    return Diagnosis("slow_start", f"still in phase '{phase}' {waited}",
                     "give serve a longer timeout, or read docker logs <container> for what it is doing", "")


def wait_ready(
    server: ServerHandle,
    probe: HealthProbe,
    *,
    timeout_s: float,
    poll_s: float = POLL_S,
    on_event: Callable[[PhaseEvent], None] | None = None,
    secrets: Iterable[str] = (),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Readiness:
    """Watch ``server`` until ``probe`` says 200, the process dies, or ``timeout_s`` passes."""
    secrets = tuple(secrets)
    began = clock()
    result = Readiness(ready=False, phase="container", elapsed_s=0.0)
    initial_restarts = server.state().restarts

    def reach(phase: str, detail: str = "") -> None:
        result.phase = phase
        event = PhaseEvent(phase, clock() - began, detail)
        result.events.append(event)
        if on_event:
            on_event(event)

    reach("container")
    while True:
        tick = clock()
        for line in server.new_log_lines():
            phase = phases.phase_of_line(line)
            if phase and phases.later(result.phase, phase):
                reach(phase, phases.line_detail(line))
        state = server.state()
        if not state.running or state.restarts > initial_restarts:
            result.exited = True
            result.elapsed_s = clock() - began
            result.diagnosis = diagnose(server.log_text(), state.exit_code, state.oom_killed, secrets)
            return result
        result.last_health = probe()
        if result.last_health == 200:
            reach("ready")
            result.ready = True
            result.elapsed_s = clock() - began
            return result
        if clock() - began >= timeout_s:
            result.elapsed_s = clock() - began
            result.diagnosis = _timeout_diagnosis(result.phase, result.elapsed_s, server.log_text(), secrets)
            return result
        sleep(max(0.0, poll_s - (clock() - tick)))
