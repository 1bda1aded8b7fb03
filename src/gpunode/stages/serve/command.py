"""Start the SGLang server container on an engine and wait until it serves, showing its startup
phases; on failure, say why and what fixes it. The serve stage runs it on the node's engine
(gpunode.stages.serve.stage); ``gpunode serve --local`` on this machine's.

Exit codes (gpunode.ground.exitcodes): 0 the server is ready (``/health_generate`` answered 200); 1 it did
not become ready: it exited (diagnosed from its log, container stopped so that it does not restart
in a loop), Docker refused it, no way to hand the GPUs in, or the timeout passed; 2 bad input: the
profile or the API key's SecretRef cannot be read; 3 the Docker engine cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from rich.console import Console

from gpunode.ground import exitcodes

from gpunode.catalogue import handoff as handoffs, profiles
from gpunode.derive import server_launch
from gpunode.stages.engine import docker_client, probe_address
from gpunode.hostfile import Host
from gpunode.stages.serve import docker_run, readiness
from gpunode.derive import serverspec as specs
from gpunode.stages.serve.diagnose import Diagnosis

EXIT_OK = exitcodes.OK
EXIT_FAILED = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_UNREACHABLE = exitcodes.UNREACHABLE
DEFAULT_TIMEOUT_S = 3600.0  # a cold load of ~410-453 GB plus autotune can take tens of minutes


@dataclass
class ServeOutcome:
    exit_code: int
    start: docker_run.StartResult | None = None
    readiness: readiness.Readiness | None = None
    diagnosis: Diagnosis | None = None
    messages: list[str] = field(default_factory=list)

    def cause(self) -> str:
        """Why the server did not start or serve, on one line: the diagnosis, else the refusal."""
        if self.diagnosis is not None:
            evidence = f" (log: {self.diagnosis.evidence})" if self.diagnosis.evidence else ""
            return f"{self.diagnosis.title}{evidence} -> {self.diagnosis.fix}"
        return self.messages[0] if self.messages else f"exit {self.exit_code}"

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "start": self.start.as_dict() if self.start else None,
                "readiness": self.readiness.as_dict() if self.readiness else None,
                "diagnosis": self.diagnosis.as_dict() if self.diagnosis else None, "messages": self.messages}


def is_local_daemon(docker_url: str | None) -> bool:
    return docker_url is None or docker_url.startswith("unix://")


def connect(docker_url: str | None) -> docker.DockerClient:
    client = docker_client(docker_url)
    client.ping()
    return client


def build_spec(host: Host, image_tag: str, handoff: handoffs.GpuHandoff, with_api_key: bool,
               name: str = specs.CONTAINER_NAME, memlock_bytes: int = -1,
               launch: profiles.Launch | None = None) -> dict[str, Any]:
    """The server container for ``host``: ``launch`` as gpunode.derive made it (the stage passes the
    inventory's), derived here when not given."""
    launch = launch or server_launch(host)
    return specs.container_spec(image=image_tag, argv=launch.argv, env=launch.env, model_dir=str(host.model.path),
                                bind=host.server.bind, port=host.server.port, gpus=handoff,
                                api_key=with_api_key, name=name, memlock_bytes=memlock_bytes)


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False)


def _say_diagnosis(console: Console, diagnosis: Diagnosis) -> None:
    _say(console, f"server: FAILED: {diagnosis.title}")
    if diagnosis.evidence:
        _say(console, f"  log:  {diagnosis.evidence}")
    _say(console, f"  fix:  {diagnosis.fix}")


@dataclass(frozen=True)
class Prepared:
    """The server container as run_serve would make it: the engine, the spec, the key, the hand-off."""

    client: docker.DockerClient
    spec: dict[str, Any]
    api_key: str | None
    handoff: handoffs.GpuHandoff
    local: bool


class NotPrepared(Exception):
    """No spec can be made: ``exit_code`` and the line the server's output says (the message names a
    SecretRef or profile, never a secret's value)."""

    def __init__(self, exit_code: int, message: str, said: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.said = said


def prepare(host: Host, image_tag: str, docker_url: str | None, *, gpu_handoff: handoffs.GpuHandoff | None = None,
            dev_root: Path = Path("/dev"), name: str = specs.CONTAINER_NAME, memlock_bytes: int = -1,
            engine_is_local: bool | None = None, launch: profiles.Launch | None = None) -> Prepared:
    """The container spec for ``host`` on the engine at ``docker_url`` (see run_serve for the
    keywords): the one place both starting the server and foreseeing what a start would do build
    it, so that both compare the same spec. Raises NotPrepared."""
    local = is_local_daemon(docker_url) if engine_is_local is None else engine_is_local
    try:
        launch = launch or server_launch(host)
        api_key = host.server.api_key.resolve() if host.server.api_key else None
    except (profiles.ProfileError, LookupError, OSError) as exc:
        raise NotPrepared(EXIT_BAD_INPUT, str(exc), f"server: error: {exc}") from None
    try:
        client = connect(docker_url)
        handoff = gpu_handoff or handoffs.choose(
            client.info(), host.container.gpus, local=local, configured=host.container.gpu_handoff, dev_root=dev_root)
    except docker.errors.DockerException as exc:
        raise NotPrepared(EXIT_UNREACHABLE, str(exc), f"server: error: Docker at {docker_url or 'the default socket'} "
                                                      f"is unreachable: {exc}") from None
    except handoffs.HandoffError as exc:
        raise NotPrepared(EXIT_FAILED, str(exc), f"server: error: {exc}") from None
    spec = build_spec(host, image_tag, handoff, api_key is not None, name, memlock_bytes, launch)
    return Prepared(client, spec, api_key, handoff, local)


def foresee(host: Host, image_tag: str, docker_url: str | None, **keywords: Any) -> docker_run.Decision:
    """What run_serve would do to the server container now (kept, started, created, replaced, and
    why), without doing it; ``keywords`` as run_serve takes them. Raises NotPrepared, or ServeError
    for a container of the name that gpunode did not start."""
    prepared = prepare(host, image_tag, docker_url, **keywords)
    return docker_run.decide(prepared.client, prepared.spec, docker_run.server_key(prepared.api_key))


def run_serve(host: Host, image_tag: str, docker_url: str | None, console: Console, timeout_s: float, *,
              gpu_handoff: handoffs.GpuHandoff | None = None, dev_root: Path = Path("/dev"),
              poll_s: float = readiness.POLL_S, name: str = specs.CONTAINER_NAME,
              memlock_bytes: int = -1, engine_is_local: bool | None = None,
              launch: profiles.Launch | None = None, probe_url: str | None = None) -> ServeOutcome:
    """``serve`` with its findings returned; ``gpu_handoff`` overrides detection and ``memlock_bytes``
    the unlimited memlock (tests and labs on machines that cannot give it). ``engine_is_local``
    False says that a unix socket is an SSH forward of the node's engine: the server's port is on
    the node, so readiness is probed through ``probe_url`` (a forward of that port), else from inside
    the container (a python3 started there for each probe: about a second)."""
    try:
        prepared = prepare(host, image_tag, docker_url, gpu_handoff=gpu_handoff, dev_root=dev_root, name=name,
                           memlock_bytes=memlock_bytes, engine_is_local=engine_is_local, launch=launch)
    except NotPrepared as exc:
        _say(console, exc.said)
        return ServeOutcome(exc.exit_code, messages=[str(exc)])
    client, spec, api_key, handoff, local = (prepared.client, prepared.spec, prepared.api_key, prepared.handoff,
                                             prepared.local)
    secrets = (api_key,) if api_key else ()
    try:
        start = docker_run.ensure_server(client, spec, api_key)
    except docker_run.ServeError as exc:
        if exc.diagnosis:
            _say_diagnosis(console, exc.diagnosis)
        else:
            _say(console, f"server: error: {exc}")
        return ServeOutcome(EXIT_FAILED, diagnosis=exc.diagnosis, messages=[str(exc)])
    _say(console, f"server: {start.action} {start.name} {start.container_id[:12]} ({start.reason}); "
                  f"image {image_tag}, GPUs via {handoff.kind}")
    container = client.containers.get(start.container_id)
    watched = docker_run.DockerServer(container)
    probe: readiness.HealthProbe
    if local:
        probe = readiness.HttpHealthProbe(f"http://{probe_address(host.server.bind)}:{host.server.port}")
    elif probe_url is not None:
        probe = readiness.HttpHealthProbe(probe_url)
    else:
        probe = docker_run.ExecHealthProbe(container, host.server.port)

    def show(event: readiness.PhaseEvent) -> None:
        _say(console, f"server: [{event.at_s:7.1f} s] {event.says()}")

    try:
        result = readiness.wait_ready(watched, probe, timeout_s=timeout_s, poll_s=poll_s, on_event=show,
                                      secrets=secrets)
    finally:
        watched.close()
    outcome = ServeOutcome(EXIT_OK if result.ready else EXIT_FAILED, start, result, result.diagnosis)
    if result.ready:
        _say(console, f"server: ready at http://{probe_address(host.server.bind)}:{host.server.port} "
                      f"({result.elapsed_s:.1f} s)")
        return outcome
    assert result.diagnosis is not None
    _say_diagnosis(console, result.diagnosis)
    if result.exited:
        # unless-stopped would restart a broken launch forever; stopped, it stays for `docker logs`.
        docker_run.stop_quietly(container)
        _say(console, f"server: container {start.name} stopped; its log: docker logs {start.name}")
    else:
        _say(console, f"server: not ready after {result.elapsed_s:.0f} s; the container is left running "
                      f"(phase: {result.phase})")
    return outcome


def serve(host: Host, image_tag: str, docker_url: str | None, console: Console,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Start (or keep) the server for ``host`` from ``image_tag`` and wait until it serves."""
    return run_serve(host, image_tag, docker_url, console, timeout_s).exit_code
