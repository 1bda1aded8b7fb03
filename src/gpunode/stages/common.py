"""The GPU-side stages of provision (image, p2p, serve, smoke), run from where gpunode runs: what
they share. Each stage's own code is its package's ``stage`` module (gpunode.stages.image.stage, ...).

A stage works on one ``Target``: the validated host and the values derived from it once
(gpunode.derive), as the inventory carries them into Ansible; the Ansible module
``gpunode.core.gpunode_stage`` turns its arguments back into one and calls ``run``. Each stage runs
against the node's Docker engine through an SSH forward (gpunode.stages.engine).
"""

from __future__ import annotations

import inspect
import io
import json
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console

from gpunode.derive import Derived, derive
from gpunode.ground.result import StageResult
from gpunode.hostfile import Host, SecretRef, Ssh
from gpunode.stages.engine import forward

# The stages run from the modules gpunode.core.gpunode_stage dispatches to (each its package's stage module).
GPU_STAGES = ("model", "image", "p2p", "serve", "smoke", "router", "monitor")


@dataclass(frozen=True)
class Target:
    """A host and its derived values: what every GPU-side stage works from."""

    host: Host
    derived: Derived
    fabric: dict[str, Any] | None = None  # the Proxmox host's PCIe fabric facts (the p2p verdict's causes)

    @classmethod
    def of(cls, host: Host) -> Target:
        return cls(host, derive(host))

    @classmethod
    def from_data(cls, host: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None,
                  fabric: dict[str, Any] | None = None) -> Target:
        """From the inventory's ``gpunode_host`` and ``gpunode_derived`` (a module checks its input
        against the models; it computes nothing); ``api_key_file`` is the run's secret file, which
        stands in for an env secret (those are kept out of Ansible's environment); ``fabric`` the
        host's PCIe fabric facts, read on the Proxmox host by the play (gpunode.core.nvidia_host_facts)."""
        chosen = Host.model_validate(host)
        if api_key_file and chosen.server.api_key is not None:
            chosen = chosen.model_copy(update={"server": chosen.server.model_copy(
                update={"api_key": SecretRef(file=Path(api_key_file))})})
        return cls(chosen, Derived.model_validate(derived), fabric or None)


@dataclass(frozen=True)
class Reach:
    """Where a stage's engine is: the machine's SSH, the ports to forward, the image the stage needs;
    no image: the stage needs no Docker engine there (the model stage) and reaches it itself."""

    ssh: Ssh
    ports: tuple[int, ...]
    image: str | None


def console(buffer: io.StringIO) -> Console:
    """A plain console writing into ``buffer``: a stage's output becomes its summary lines."""
    return Console(file=buffer, width=160, highlight=False, soft_wrap=True, color_system=None)


def node_handoff(host: Host, client: Any) -> Any:
    """The hand-off the node stage set up, as gpunode.catalogue.handoff chooses it: its CDI spec through
    Docker's CDI, or read from the node and given as explicit devices and mounts; or NVIDIA's runtime."""
    from gpunode.catalogue import handoff
    from gpunode.stages.engine import read_file

    info = client.info()
    spec = None
    if host.container.gpu_handoff == "host-driver" and not handoff.cdi_enabled(info):
        text = read_file(host.container.reach, handoff.CDI_SPEC_FILE)
        spec = json.loads(text) if text else None
    return handoff.choose(info, host.container.gpus, local=False, configured=host.container.gpu_handoff,
                          cdi_spec=spec)


def _stage(name: str) -> ModuleType:
    if name not in GPU_STAGES:
        raise ValueError(f"unknown GPU-side stage {name!r} (stages: {', '.join(GPU_STAGES)})")
    return import_module(f"gpunode.stages.{name}.stage")


def preload(name: str) -> None:
    """Import what the stage ``name`` runs with: its stage module and what that module imports in its
    functions (kept there so that the CLI starts fast), read from its source. Called in Ansible's own
    process as the stage's play starts (gpunode.core.mitogen_linear), so the processes Ansible forks
    for the play's tasks inherit them instead of each importing them again (0.5 s a stage)."""
    import ast

    module = _stage(name)
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else
                 [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        for imported in names:
            if imported.split(".")[0] in ("gpunode", "docker"):
                import_module(imported)


def target_from_data(name: str, host: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None,
                     fabric: dict[str, Any] | None = None, hub_token_file: str | None = None) -> Any:
    """The stage's target from the inventory's data, as the stage reads it (a host's ``Target``; the
    router's settings for the router). ``hub_token_file``: the run's file with the Hub token, which
    only the stage that fetches (model) takes."""
    make = _stage(name).target_from_data
    if hub_token_file:
        if "hub_token_file" not in inspect.signature(make).parameters:
            raise ValueError(f"a Hub token is for the stage that fetches the model, not the {name} stage")
        return make(host, derived, api_key_file, fabric, hub_token_file=hub_token_file)
    return make(host, derived, api_key_file, fabric)


def run(name: str, target: Any, check_mode: bool) -> StageResult:
    """Run one GPU-side stage for ``target`` on its machine's engine (messages say no stage name:
    the module puts it in front)."""
    import docker

    stage = _stage(name)
    reach: Reach = stage.reach(target)
    if reach.image is None:
        return stage.run(target, None, check_mode)  # type: ignore[no-any-return]
    missing = (f"the image {reach.image} is not on the node's engine: run the image stage first "
               "(`gpunode provision --tags image`)")
    try:
        with forward(reach.ssh, reach.ports) as fw:
            return stage.run(target, fw, check_mode)  # type: ignore[no-any-return]
    except docker.errors.ImageNotFound:
        return StageResult(failed=True, summary=[missing])
    except docker.errors.NotFound as exc:
        if "No such image" in str(exc):
            return StageResult(failed=True, summary=[missing])
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
    except docker.errors.DockerException as exc:
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])


__all__ = ["GPU_STAGES", "Reach", "StageResult", "Target", "console", "node_handoff", "preload", "run", "target_from_data"]
