"""The GPU and driver hand-off to a container, one rule for gpunode: ``choose`` is what the serve
and p2p stages, the node stage's probes (through a filter) and the checks start their containers
with, so all of them get the same devices and driver files.

``container.gpu_handoff: host-driver`` (the default): the node's CDI spec (gpunode.io/gpu, written
by the node stage from the host's driver tree) through Docker's CDI on Docker 25+, else the same
list by hand (``--device`` per node and each driver file read-only), which Debian 12's Docker 20.10
needs. ``nvidia-runtime``: NVIDIA's runtime, installed by the node stage. The names (paths, the CDI
kind) are gpunode.ground.nvidia's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from docker.types import Mount

from gpunode.ground.nvidia import CDI_KIND, CDI_SPEC_FILE, CONTROL_NODES, MOUNT_POINT, OPTIONAL_NODES, TREE_ROOT

__all__ = ["CDI_KIND", "CDI_SPEC_FILE", "MOUNT_POINT", "TREE_ROOT", "GpuHandoff", "HandoffError", "cdi_enabled",
           "choose", "from_cdi_spec", "gpu_node_paths"]

_NODE_NAMES = tuple(path[len("/dev/"):] for path in CONTROL_NODES + OPTIONAL_NODES)


class HandoffError(Exception):
    """No way to hand the GPUs in; the message says what is missing and which stage makes it."""


@dataclass(frozen=True)
class GpuHandoff:
    """How the GPUs reach the container: the node's CDI spec, device nodes (and the driver tree)
    handed in by hand, or the NVIDIA runtime."""

    kind: Literal["runtime", "devices", "cdi"]
    device_ids: tuple[str, ...] = ()  # runtime: which GPUs, empty means all; cdi: the CDI device names
    nodes: tuple[tuple[str, str], ...] = ()  # devices: (path on the node, path in the container)
    binds: tuple[tuple[str, str], ...] = ()  # devices: the driver's files, read-only (node path, container path)

    @classmethod
    def runtime(cls, gpus: str | Sequence[int]) -> GpuHandoff:
        return cls("runtime", () if gpus == "all" else tuple(str(g) for g in gpus))

    @classmethod
    def cdi(cls, gpus: str | Sequence[int]) -> GpuHandoff:
        names = ("all",) if gpus == "all" else tuple(str(g) for g in gpus)
        return cls("cdi", tuple(f"{CDI_KIND}={name}" for name in names))

    @classmethod
    def device_nodes(cls, paths: Sequence[str], dev_root: str = "/dev",
                     binds: Sequence[tuple[str, str]] = ()) -> GpuHandoff:
        """Each node keeps its name under /dev inside (a lab keeps its nodes outside /dev);
        ``binds``: the driver's files, mounted read-only."""
        root = PurePosixPath(dev_root)
        pairs = []
        for path in paths:
            inside = PurePosixPath("/dev") / PurePosixPath(path).relative_to(root)
            pairs.append((path, str(inside)))
        return cls("devices", nodes=tuple(pairs), binds=tuple(binds))

    def docker_kwargs(self) -> dict[str, Any]:
        from docker.types import DeviceRequest  # the Docker SDK only where a container is made

        if self.kind == "runtime":
            request = (DeviceRequest(device_ids=list(self.device_ids), capabilities=[["gpu"]]) if self.device_ids
                       else DeviceRequest(count=-1, capabilities=[["gpu"]]))
            return {"device_requests": [request]}
        if self.kind == "cdi":
            return {"device_requests": [DeviceRequest(driver="cdi", device_ids=list(self.device_ids))]}
        return {"devices": [f"{outside}:{inside}:rwm" for outside, inside in self.nodes]}

    def cli_args(self) -> list[str]:
        """The same hand-off as `docker run` arguments (the node stage's probes and the checks
        start their containers so)."""
        if self.kind == "runtime":
            return ["--gpus", "device=" + ",".join(self.device_ids) if self.device_ids else "all"]
        if self.kind == "cdi":
            return [f"--device={name}" for name in self.device_ids]
        return ([f"--device={outside}:{inside}:rwm" for outside, inside in self.nodes]
                + [f"--volume={outside}:{inside}:ro" for outside, inside in self.binds])

    def run_kwargs(self) -> dict[str, Any]:
        """docker_kwargs plus the driver's files, for a container with no mounts of its own."""
        return {**self.docker_kwargs(), **({"mounts": self.mounts()} if self.binds else {})}

    def mounts(self) -> list[Mount]:
        """The driver's files, read-only, each where the image looks for it (they carry their
        SONAMEs, so no ldconfig or symlink hook is needed)."""
        from docker.types import Mount

        return [Mount(target=inside, source=outside, type="bind", read_only=True) for outside, inside in self.binds]



def gpu_node_paths(dev_root: Path, gpus: str | list[int]) -> list[str]:
    """The NVIDIA device nodes present under ``dev_root``: the selected /dev/nvidiaN, then the
    control nodes, then MIG capability nodes. Missing selected GPUs are simply absent here; the
    caller compares."""
    paths: list[str] = []
    if isinstance(gpus, str):  # "all"
        minors = sorted(int(p.name[6:]) for p in dev_root.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    else:
        minors = list(gpus)
    paths.extend(str(dev_root / f"nvidia{m}") for m in minors if (dev_root / f"nvidia{m}").exists())
    paths.extend(str(dev_root / name) for name in _NODE_NAMES if (dev_root / name).exists())
    caps = dev_root / "nvidia-caps"
    if caps.is_dir():
        paths.extend(str(p) for p in sorted(caps.iterdir()))
    return paths


def cdi_enabled(info: Mapping[str, Any]) -> bool:
    """Docker 25+ lists its CDI spec folders in /info when CDI is on (by default from 28.2)."""
    return bool(info.get("CDISpecDirs"))


def from_cdi_spec(spec: Mapping[str, Any], gpus: str | list[int]) -> GpuHandoff:
    """The node's CDI spec as explicit devices and read-only mounts, for a Docker without CDI
    (Debian 12's 20.10): the same list, so both ways give the server the same files."""
    devices = {str(d.get("name")): d.get("containerEdits") or {} for d in spec.get("devices") or []}
    names = ["all"] if gpus == "all" else [str(g) for g in gpus]
    missing = [name for name in names if name not in devices]
    if missing:
        raise HandoffError(f"the node's CDI spec ({CDI_SPEC_FILE}) has no device {', '.join(missing)}: re-run the node "
                         "stage (`gpunode provision --tags node`)")
    edits = [devices[name] for name in names] + [spec.get("containerEdits") or {}]
    paths = list(dict.fromkeys(str(n["path"]) for edit in edits for n in edit.get("deviceNodes") or []))
    binds = [(str(m["hostPath"]), str(m["containerPath"])) for edit in edits for m in edit.get("mounts") or []]
    return GpuHandoff.device_nodes(paths, binds=list(dict.fromkeys(binds)))


def choose(info: Mapping[str, Any], gpus: str | list[int], *, local: bool,
                       configured: str = "host-driver", cdi_spec: Mapping[str, Any] | None = None,
                       dev_root: Path = Path("/dev")) -> GpuHandoff:
    """How the server gets the GPUs and the driver: ``configured`` is the host file's
    ``container.gpu_handoff``. host-driver: the node's CDI spec through Docker's CDI when it has it,
    else the same list by hand (``cdi_spec``: the spec's content; read here when the engine is
    local). nvidia-runtime: NVIDIA's runtime, which the node stage installed."""
    if configured == "nvidia-runtime":
        runtimes = info.get("Runtimes") or {}
        if "nvidia" in runtimes or (local and shutil.which("nvidia-container-runtime-hook")):
            return GpuHandoff.runtime(gpus)
        raise HandoffError("the host file picks gpu_handoff nvidia-runtime, but Docker has no nvidia runtime: run the "
                         "node stage (`gpunode provision --tags node`), which installs nvidia-container-toolkit")
    if cdi_enabled(info):
        return GpuHandoff.cdi(gpus)
    if cdi_spec is None and local and Path(CDI_SPEC_FILE).is_file():
        cdi_spec = json.loads(Path(CDI_SPEC_FILE).read_text())
    if cdi_spec is not None:
        return from_cdi_spec(cdi_spec, gpus)
    if not local:
        raise HandoffError(f"no CDI spec {CDI_SPEC_FILE} on the node, and its Docker has no CDI: run the node stage "
                         "(`gpunode provision --tags node`), which writes it from the host's driver tree")
    paths = gpu_node_paths(dev_root, gpus)
    found = {Path(p).name for p in paths}
    wanted = ([f"nvidia{g}" for g in gpus] if gpus != "all" else []) + [p[5:] for p in CONTROL_NODES[:2]]
    missing = [name for name in wanted if name not in found]
    if missing or not any(n[6:].isdigit() for n in found):
        raise HandoffError(f"no CDI spec {CDI_SPEC_FILE} here and device nodes missing under {dev_root}: "
                         f"{', '.join(missing) or 'no /dev/nvidiaN'}; run the node stage")
    # Only the nodes: a machine without gpunode's driver tree must bring the driver in its image.
    return GpuHandoff.device_nodes(paths, str(dev_root))
