"""The GPU-side stages of provision (image, p2p, serve, smoke), run from where gpunode runs: what
they share. Each stage's own code is its package's ``stage`` module (gpunode.image.stage, ...).

A stage works on one ``Target``: the validated host and the values derived from it once
(gpunode.derive), as the inventory carries them into Ansible; the Ansible module
``gpunode.core.gpunode_stage`` turns its arguments back into one and calls ``run``. Each stage runs
against the node's Docker engine through an SSH forward (gpunode.engine).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from gpunode.derive import Derived, derive
from gpunode.engine import Forward, forward
from gpunode.hostfile import Host, SecretRef

GPU_STAGES = ("image", "p2p", "serve", "smoke", "router")


@dataclass(frozen=True)
class Target:
    """A host and its derived values: what every GPU-side stage works from."""

    host: Host
    derived: Derived

    @classmethod
    def of(cls, host: Host) -> Target:
        return cls(host, derive(host))

    @classmethod
    def from_data(cls, host: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None) -> Target:
        """From the inventory's ``gpunode_host`` and ``gpunode_derived`` (a module checks its input
        against the models; it computes nothing); ``api_key_file`` is the run's secret file, which
        stands in for an env secret (those are kept out of Ansible's environment)."""
        chosen = Host.model_validate(host)
        if api_key_file and chosen.server.api_key is not None:
            chosen = chosen.model_copy(update={"server": chosen.server.model_copy(
                update={"api_key": SecretRef(file=Path(api_key_file))})})
        return cls(chosen, Derived.model_validate(derived))


@dataclass
class StageResult:
    changed: bool = False
    failed: bool = False
    summary: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None  # why it failed, where the summary's first line is a note, not the cause

    def failure(self) -> str:
        """The failure's own message (the task's msg, hence the recap's and summary.json's)."""
        return self.cause or (self.summary[0] if self.summary else "failed")


def console(buffer: io.StringIO) -> Console:
    """A plain console writing into ``buffer``: a stage's output becomes its summary lines."""
    return Console(file=buffer, width=160, highlight=False, soft_wrap=True, color_system=None)


def node_handoff(host: Host, client: Any) -> Any:
    """The hand-off the node stage set up, as gpunode.handoff chooses it: its CDI spec through
    Docker's CDI, or read from the node and given as explicit devices and mounts; or NVIDIA's runtime."""
    from gpunode import handoff
    from gpunode.engine import read_file

    info = client.info()
    spec = None
    if host.container.gpu_handoff == "host-driver" and not handoff.cdi_enabled(info):
        text = read_file(host.container.reach, handoff.CDI_SPEC_FILE)
        spec = json.loads(text) if text else None
    return handoff.choose(info, host.container.gpus, local=False, configured=host.container.gpu_handoff,
                          cdi_spec=spec)


def _runner(name: str) -> Callable[[Any, Forward, bool], StageResult]:
    return import_module(f"gpunode.{name}.stage").run  # type: ignore[no-any-return]


def target_from_data(name: str, host: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None) -> Any:
    """The stage's target from the inventory's data: a host's (Target), or the router's
    (gpunode.router.stage.RouterTarget: ``host`` is then the router's settings)."""
    if name == "router":
        from gpunode.router.stage import RouterTarget

        return RouterTarget.from_data(host, derived, api_key_file)
    return Target.from_data(host, derived, api_key_file)


def run(name: str, target: Any, check_mode: bool) -> StageResult:
    """Run one GPU-side stage for ``target`` on its machine's engine: the node's, or for the router
    the router machine's (messages say no stage name: the module puts it in front)."""
    import docker

    if name not in GPU_STAGES:
        raise ValueError(f"unknown GPU-side stage {name!r} (stages: {', '.join(GPU_STAGES)})")
    if name == "router":
        reach, ports = target.derived.reach, (target.router.port, target.router.metrics_port)
        image = target.derived.image_tag
    else:
        host = target.host
        reach, ports = host.container.reach, ((host.server.port,) if name == "smoke" else ())
        image = target.derived.image_tag if name == "p2p" else target.derived.server_image
    missing = (f"the image {image} is not on the node's engine: run the image stage first "
               "(`gpunode provision --tags image`)")
    try:
        with forward(reach, ports) as fw:
            return _runner(name)(target, fw, check_mode)
    except docker.errors.ImageNotFound:
        return StageResult(failed=True, summary=[missing])
    except docker.errors.NotFound as exc:
        if "No such image" in str(exc):
            return StageResult(failed=True, summary=[missing])
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
    except docker.errors.DockerException as exc:
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])


__all__ = ["GPU_STAGES", "StageResult", "Target", "console", "node_handoff", "run", "target_from_data"]
