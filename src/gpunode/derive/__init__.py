"""Values derived from a validated host once, in one place: what the stages are given, what
``gpunode check`` expects and what ``gpunode plan`` shows.

``derive(host)`` computes them; the inventory carries them into Ansible beside the host itself
(``gpunode_host``, ``gpunode_derived``), and the GPU-side stages read them back from there, so no
stage parses the host file or computes them again (ARCHITECTURE.md, "The seam").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpunode.catalogue import profiles, stacks
from gpunode.hostfile import IP_NONE, reached_at, ROUTER_NODE, Container, Host, HostFile, Ssh, worker_address
from gpunode.catalogue import aot, bases
from gpunode.catalogue.aot import AotPlan
from gpunode.ground.marks import OWNER_TAG, mark_line
from gpunode.ground.nvidia import CAPS_DIR, CONTROL_NODES, DEV_MODE, OPTIONAL_NODES
from gpunode.ground.paths import MODULE_UTILS, PACKAGE
from gpunode.derive.serverspec import CONTAINER_NAME
from gpunode.derive.modelplan import ModelPlan, plan as model_plan
from gpunode.derive.monitorspec import MonitorPlan, plan as monitor_plan


def node_name(host: Host) -> str:
    """Inventory name of a host's GPU container."""
    return f"{host.name}-ct{host.container.vmid}"


@dataclass(frozen=True)
class DevEntry:
    key: str
    path: str
    when: str

    @property
    def value(self) -> str:
        return f"{self.path},mode={DEV_MODE}"


def dev_entries(container: Container) -> list[DevEntry]:
    """The devN lines for a container, in the order the container stage writes them.

    With ``gpus: all`` the GPU lines are found on the host at run time; the plan shows the rule.
    """
    paths: list[tuple[str, str]] = []
    if container.gpus == "all":
        paths.append(("/dev/nvidia<N>", "one per /dev/nvidiaN found on the host"))
    else:
        paths.extend((f"/dev/nvidia{minor}", "always") for minor in container.gpus)
    paths.extend((path, "always") for path in CONTROL_NODES)
    paths.extend((path, "if present on the host") for path in OPTIONAL_NODES)
    if container.mig:
        paths.append((f"{CAPS_DIR}/<each>", "one per MIG capability node on the host"))
    return [DevEntry(f"dev{index}", path, when) for index, (path, when) in enumerate(paths)]


def net0(container: Container) -> str:
    """The net0 line: IPv4 in ip=/gw=, IPv6 in ip6=/gw6= (pve-container src/PVE/LXC/Config.pm, the
    net format); ip none leaves ip= out, as Proxmox takes a net0 without it."""
    net = container.network
    parts = [f"name=eth0,bridge={net.bridge}"]
    if net.ip != IP_NONE:
        parts.append(f"ip={net.ip}")
    if net.gateway:
        parts.append(f"gw={net.gateway}")
    if net.ip6:
        parts.append(f"ip6={net.ip6}")
    if net.gateway6:
        parts.append(f"gw6={net.gateway6}")
    if net.vlan:
        parts.append(f"tag={net.vlan}")
    return ",".join(parts)


def container_config(container: Container, host_name: str, with_devices: bool = True) -> dict[str, Any]:
    """The Proxmox config the container stage converges to (POST /nodes/{node}/lxc parameters).

    Without devices, it is what the container stage is given: the devN lines come from the nodes
    it finds on the host. ``tags`` and ``description`` carry gpunode's mark (README "What gpunode
    owns"); they are compared by inclusion, so an operator's own tags and notes stay.
    """
    config: dict[str, Any] = {
        "vmid": container.vmid,
        "hostname": container.hostname,
        "ostemplate": container.template,
        "rootfs": f"{container.storage}:{container.disk_gb}",
        "cores": container.cores,
        "memory": container.memory_gb * 1024,
        "swap": container.swap_mb,
        "net0": net0(container),
        # nesting + keyctl: Docker runs inside the container (FIELD-NOTES s3).
        "features": "nesting=1,keyctl=1",
        "unprivileged": int(container.unprivileged),
        "onboot": int(container.onboot),
        "tags": OWNER_TAG,
        "description": mark_line(host_name),
    }
    if with_devices:
        for entry in dev_entries(container):
            config[entry.key] = entry.value
    return config


def aot_plan(host: Host) -> AotPlan:
    """The FlashInfer modules the image builds ahead of time: the profile's launch on the host
    file's GPUs, as far as the image's toolchain allows."""
    stack = stacks.load(host.image.stack)
    wanted = aot.profile_modules(stack, profiles.load(host.profile_name), host.server.flags)
    toolchain = bases.toolchain_for(host.image.base_name, host.image.toolchain, stack.toolchain)
    arch = aot.gpu_arch(host.image.gpu_model)
    arch = aot.GpuArch(arch.model, stack.cuda_arch(arch.cuda_arch))
    return aot.plan_for(arch, wanted, host.image.flashinfer_aot, toolchain is not None,
                        host.image.base_name)


def image_tag(host: Host, planned: AotPlan | None = None) -> str:
    """The image's content tag: one definition, gpunode.stages.image's (base, pins, lock, patches, template,
    toolchain, the modules built ahead of time: ``planned`` when already computed)."""
    from gpunode.derive.imagecontext import image_tag as content_tag

    return content_tag(host.image, aot=planned or aot_plan(host))


def server_image(host: Host, tag: str | None = None) -> str:
    """What the server container runs: the content-tagged image (``tag`` when already computed), or
    in a lab with a stand-in the fake server's image (its tag hashes the fake's files)."""
    if host.image.lab_stand_in:
        from gpunode.ground import labdoor

        try:
            return labdoor.stand_in_tag()
        except labdoor.LabMissing as exc:
            raise ValueError(f"image.lab_stand_in: {exc}") from None
    return tag or image_tag(host)


def server_launch(host: Host) -> profiles.Launch:
    profile = profiles.load(host.profile_name)
    values = {
        "model_dir": "/model",
        "served_name": host.served_name,
        "bind": host.server.bind,
        "port": str(host.server.port),
    }
    launch = profiles.resolve(profile, values, dict(host.server.flags), dict(host.server.env))
    if host.server.api_key is not None:
        # The key itself is read on the node at start; the plan never holds it.
        launch = profiles.Launch(launch.argv + (profiles.flag_arg("--api-key", "<from " + host.server.api_key.describe() + ">"),),
                                 launch.env, {**launch.reasons, "--api-key": "required when bound beyond loopback"})
    if host.image.lab_stand_in:
        # The stand-in parses the launch with the flags of the stack's sglang (gpunode_lab/standin/sglang_server.py).
        version = host.image.pinned()["sglang"]
        launch = profiles.Launch(launch.argv, {**launch.env, "FAKE_SGLANG_VERSION": version},
                                 {**launch.reasons, "FAKE_SGLANG_VERSION": f"lab: the stand-in server takes sglang "
                                  f"{version}'s flags, as the stack's server would"})
    return launch


class Derived(BaseModel):
    """What the stages and checks need beyond the host file's own keys, computed once per host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # the host file's name of the Proxmox host
    node: str  # the inventory name of its GPU container
    container_config: dict[str, Any]  # the Proxmox config the container stage converges, without devN
    driver_mount: bool  # the host's driver tree is mounted into the container (host-driver hand-off)
    control_nodes: tuple[str, ...]  # device nodes every container gets besides the GPUs'
    optional_nodes: tuple[str, ...]  # handed in where the host has them
    aot: AotPlan  # the FlashInfer modules the image builds ahead of time
    image_tag: str  # the server image's content tag
    server_image: str  # what the server container runs (the stand-in's tag in a lab that has one)
    pins: dict[str, str]  # the image's pins: the stack's, with the host file's on top
    launch: profiles.Launch  # the server's argv, environment and the reason for each
    tp_size: int  # GPUs one server uses
    served_name: str
    server_container: str  # the server container's name on the node
    probe_sources: tuple[str, ...]  # on the controller: the scripts the node stage probes the hand-off with
    model: ModelPlan  # where the weights are, what is mounted, what the model stage checks
    monitor: MonitorPlan | None = None  # the monitor stage's settings, with the host file's monitor: section


def derive(host: Host, router_metrics_port: int | None = None) -> Derived:
    """``router_metrics_port``: the router's metrics port, when the router runs on this host's GPU
    node (the node's Prometheus scrapes it; ``derive_for`` passes it)."""
    planned = aot_plan(host)
    tag = image_tag(host, planned)
    launch = server_launch(host)
    tp_size = launch.value_of(*profiles.TP_FLAGS)
    model = model_plan(host)
    return Derived(
        name=host.name, node=node_name(host),
        container_config=container_config(host.container, host.name, with_devices=False),
        driver_mount=host.container.gpu_handoff == "host-driver",
        control_nodes=CONTROL_NODES, optional_nodes=OPTIONAL_NODES,
        aot=planned, image_tag=tag, server_image=server_image(host, tag), pins=host.image.pinned(),
        launch=launch, tp_size=int(tp_size) if tp_size is not None else 1,
        served_name=host.served_name, server_container=CONTAINER_NAME,
        probe_sources=(str(MODULE_UTILS / "nvidia_nodes.py"), str(PACKAGE / "probe" / "cuda_probe.py")),
        model=model,
        monitor=None if host.monitor is None else monitor_plan(
            host.monitor, host_name=host.name, server_bind=host.server.bind, server_port=host.server.port,
            server_container=CONTAINER_NAME, server_image=server_image(host, tag), gpus=host.container.gpus,
            # The weights' mount when the container mounts them (hub, host_path); else they lie on its root.
            store_mount=model.mount_target if model.mount_source else "/", router_metrics_port=router_metrics_port,
            nvml_module=stand_in_nvml_module() if host.image.lab_stand_in else None),
    )


def stand_in_nvml_module() -> str:
    """The lab stand-in image's NVML for the GPU exporter (the lab has no GPU: a recorded one, replayed)."""
    from gpunode.ground import labdoor

    try:
        return labdoor.stand_in_nvml_module()
    except labdoor.LabMissing as exc:
        raise ValueError(f"image.lab_stand_in: {exc}") from None


def derive_for(hostfile: HostFile, host: Host) -> Derived:
    """``derive(host)`` within its host file: with the router's metrics port where the router runs
    on this host's node."""
    router = hostfile.router
    return derive(host, router.metrics_port if router is not None and hostfile.router_host is host else None)


# ----------------------------------------------------------------------------- the router


class RouterWorkerSpec(BaseModel):
    """One host's server as the router's worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str  # the host file's name of the Proxmox host
    node: str  # the inventory name of its GPU container
    url: str  # where the router reaches the server


class RouterDerived(BaseModel):
    """What the router stage and the router check layer need, computed once from the host file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str  # the router machine's inventory name
    runs_on: str | None  # the host whose GPU node runs it, or None for a machine of its own
    reach: Ssh  # how the router machine is reached (its Docker engine, over SSH)
    workers: tuple[RouterWorkerSpec, ...]
    image_tag: str  # the router image's content tag
    argv: tuple[str, ...]  # the router's flags (never the key)
    served_name: str
    url: str  # where clients reach the router
    bench_image: str | None  # the server image on the router machine, when it is a GPU node (smoke's bench)
    model_dir: str | None  # the model folder there, for the bench's tokenizer


def router_reach(hostfile: HostFile) -> Ssh:
    """How the router machine is reached: the GPU node of ``runs_on``'s host, or its own SSH."""
    assert hostfile.router is not None
    host = hostfile.router_host
    if host is not None:
        return host.container.reach
    assert isinstance(hostfile.router.runs_on, Ssh)
    return hostfile.router.runs_on


def derive_router(hostfile: HostFile) -> RouterDerived | None:
    from gpunode.derive import routerimage as router_image
    from gpunode.derive.routerspec import router_argv

    router = hostfile.router
    if router is None:
        return None
    workers = tuple(RouterWorkerSpec(host=host.name, node=node_name(host),
                                     url=f"http://{worker_address(host)}:{host.server.port}")
                    for host in hostfile.hosts)
    on_host = hostfile.router_host
    reach = router_reach(hostfile)
    return RouterDerived(
        node=ROUTER_NODE, runs_on=on_host.name if on_host else None, reach=reach, workers=workers,
        image_tag=router_image.collect(router.image.base, router.image.ca_bundle).tag,
        argv=tuple(router_argv(router.port, [w.url for w in workers], router.policy, router.health_check_interval_s)),
        served_name=hostfile.hosts[0].served_name, url=f"http://{reached_at(router.bind, str(reach.address))}:{router.port}",
        bench_image=server_image(on_host) if on_host else None,
        model_dir=str(on_host.model.path) if on_host else None)
