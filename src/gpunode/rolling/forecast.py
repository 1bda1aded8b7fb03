"""Before a provision acts: which hosts' servers it would restart, read from each node, and which
of them serve now through the router.

A server restarts when the serve stage would replace its container: the code that decides it
(gpunode.stages.serve.stage.foresee) compares the spec a run would make with the running
container's, image, command line, environment, hand-off and key file. ``--restart-container`` or
``--recreate-container`` may restart the LXC container under any server, so with either every
running server counts. A node that cannot be read counts as restarting: nothing says it does not.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpunode.hostfile import Host

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Forecast:
    """What a provision would do to one host's server: ``action`` as the serve stage decides it
    (kept, started, created, replaced) or unknown, and why."""

    host: str
    action: str
    reason: str

    @property
    def restarts(self) -> bool:
        """Whether a server that may be serving now stops for a while (started and created ones serve nothing yet)."""
        return self.action in ("replaced", UNKNOWN)

    def line(self) -> str:
        verb = {"kept": "keeps its server", "started": "starts its stopped server", "created": "creates its server",
                "replaced": "restarts its server", UNKNOWN: "may restart its server"}[self.action]
        return f"{self.host} {verb} ({self.reason})"


def foresee_host(host: Host, container_restart: bool = False) -> Forecast:
    """One host's forecast, read from its node's engine over SSH."""
    import docker

    from gpunode.catalogue.handoff import HandoffError
    from gpunode.stages.common import Target
    from gpunode.stages.engine import EngineUnreachable, forward
    from gpunode.stages.serve import stage as serve_stage
    from gpunode.stages.serve.command import NotPrepared
    from gpunode.stages.serve.docker_run import ServeError

    try:
        target = Target.of(host)
        with forward(host.container.reach) as fw:
            decision = serve_stage.foresee(target, fw)
    except (EngineUnreachable, NotPrepared, ServeError, HandoffError, docker.errors.DockerException, OSError) as exc:
        return Forecast(host.name, UNKNOWN, f"its node cannot be read: {' '.join(str(exc).split())[:300]}")
    if container_restart and decision.action == "kept":
        return Forecast(host.name, "replaced", "--restart-container/--recreate-container may restart its container")
    return Forecast(host.name, decision.action, decision.reason)


def foresee(hosts: list[Host], container_restart: bool = False) -> dict[str, Forecast]:
    """Every host's forecast, read side by side (one SSH forward each)."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        found = list(pool.map(lambda host: foresee_host(host, container_restart), hosts))
    return {forecast.host: forecast for forecast in found}
