"""What ``gpunode provision`` would do, computed from the host file alone (nothing is contacted)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from gpunode import profiles
from gpunode.handoff import CDI_SPEC_FILE, MOUNT_POINT, TREE_ROOT
from gpunode.hostfile import Container, Host, HostFile, Image
from gpunode import stacks
from gpunode.image import aot, bases
from gpunode.image.aot import AotPlan
from gpunode.serve.spec import CONTAINER_NAME, JIT_CACHE_MOUNT, jit_cache_volume
from gpunode.stages import STAGES

# Device nodes every GPU container needs besides one /dev/nvidiaN per GPU (FIELD-NOTES s2).
CONTROL_NODES: tuple[tuple[str, str], ...] = (
    ("/dev/nvidiactl", "always"),
    ("/dev/nvidia-uvm", "always"),
    ("/dev/nvidia-uvm-tools", "always"),
    ("/dev/nvidia-modeset", "if present on the host"),
)
DEV_MODE = "0666"  # what the NVIDIA driver itself gives these nodes on the host


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
    paths.extend(CONTROL_NODES)
    if container.mig:
        paths.append(("/dev/nvidia-caps/<each>", "one per MIG capability node on the host"))
    return [DevEntry(f"dev{index}", path, when) for index, (path, when) in enumerate(paths)]


def net0(container: Container) -> str:
    net = container.network
    value = f"name=eth0,bridge={net.bridge},ip={net.ip}"
    if net.gateway:
        value += f",gw={net.gateway}"
    if net.vlan:
        value += f",tag={net.vlan}"
    return value


def container_config(container: Container, host_name: str, with_devices: bool = True) -> dict[str, Any]:
    """The Proxmox config the container stage converges to (POST /nodes/{node}/lxc parameters).

    Without devices, it is what the container stage is given: the devN lines come from the nodes
    it finds on the host. ``tags`` and ``description`` carry gpunode's mark (README "What gpunode
    owns"); they are compared by inclusion, so an operator's own tags and notes stay.
    """
    from gpunode.pve.lxc import OWNER_TAG, mark_line

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


def host_changes(host: Host) -> list[str]:
    prep = host.prepare
    changes = []
    if prep.release_vfio:
        changes.append("release GPUs bound to vfio-pci: drop their ids from /etc/modprobe.d and the kernel command line, rebuild the initramfs")
    if prep.disable_hmm:
        changes.append("options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d (avoids cuInit error 3)")
    if prep.persistenced:
        changes.append("nvidia-persistenced enabled and running")
    changes.append("NVIDIA device nodes created at boot (nvidia-modprobe -u -c=0)")
    changes.append(f"NVIDIA driver {host.driver.version} (open kernel module) installed if missing")
    changes.append(f"every installed kernel: its headers (proxmox-headers-<kernel>) installed and the NVIDIA "
                   f"{host.driver.version} DKMS module built for it (dkms install -k <kernel>), before the reboot "
                   "that needs it; the recap says whether it is safe to reboot")
    changes.append("pins the newest kernel the module is built for (proxmox-boot-tool kernel pin) when the one that "
                   "boots next cannot get it" if prep.pin_kernel else
                   "never pins a kernel (prepare.pin_kernel): if the module cannot be built for the kernel that boots "
                   "next, the stage stops before any change")
    if host.container.gpu_handoff == "host-driver":
        changes.append(f"the loaded driver's user space as a tree in {TREE_ROOT}/<version> (one per version; "
                       "the container stage removes those no container mounts)")
    if prep.allow_module_reload:
        changes.append("nvidia_uvm reloaded when its options change")
    changes.append("reboot when needed" if prep.allow_reboot else "never reboots: reports 'reboot needed' instead")
    return changes


def handoff(host: Host) -> dict[str, Any]:
    """Which GPU and driver hand-off, why, and what each layer holds (host -> container -> Docker)."""
    version = host.driver.version
    if host.container.gpu_handoff == "nvidia-runtime":
        return {"kind": "nvidia-runtime",
                "why": "container.gpu_handoff picks it: NVIDIA's user space (.run, --no-kernel-module) and "
                       "nvidia-container-toolkit from NVIDIA's repository inside the container; must be redone "
                       "after every host driver update",
                "layers": [f"host: NVIDIA driver {version} (kernel module and user space)",
                           f"container: devN nodes + NVIDIA's user space {version} installed from its .run",
                           "Docker: the nvidia runtime (--gpus), no-cgroups = true for LXC"]}
    tree = f"{TREE_ROOT}/{version}"
    return {"kind": "host-driver",
            "why": "default: the host's own user space, shared read-only down the chain; nothing to download from "
                   "NVIDIA and nothing that can drift from the kernel module",
            "mount": f"{tree},mp={MOUNT_POINT},ro=1",
            "layers": [f"host: NVIDIA driver {version}; its user space under its SONAMEs in {tree}/{{lib64,bin}} "
                       "(hard links, built by the host stage)",
                       f"container: devN nodes + that tree read-only at {MOUNT_POINT} (an mpN mount point), "
                       "lib64 on the loader's path; nothing installed",
                       f"Docker: {CDI_SPEC_FILE} (nodes + each file read-only) through CDI on Docker 25+, "
                       "else the same list as --device and read-only mounts (Debian 12's Docker 20.10)"]}


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
    """The image's content tag: one definition, gpunode.image's (base, pins, lock, patches, template,
    toolchain, the modules built ahead of time: ``planned`` when already computed)."""
    from gpunode.image.context import image_tag as content_tag

    return content_tag(host.image, aot=planned or aot_plan(host))


def image_section(host: Host) -> dict[str, Any]:
    """The image as plan shows it: base and digest status, toolchain, target arch, the FlashInfer
    modules built ahead of time (and what is left to the JIT), the JIT cache volume."""
    image = host.image
    stack = stacks.load(image.stack)
    base = bases.parse(image.base_name)
    catalog = bases.base_of(image.base_name)
    toolchain = bases.toolchain_for(image.base_name, image.toolchain, stack.toolchain)
    if base.local:
        digest = "none: made on the build engine with debootstrap (not from a registry)"
    elif base.digest:
        digest = f"pinned: {base.digest}"
    else:
        digest = ("unpinned tag: the digest pulled is recorded in the image's labels, a later build from a moved "
                  "tag says so; pin with image.base: <name>@sha256:<digest>")
    if toolchain is None:
        toolchain_text = (f"none: base {base.name} has no nvcc; FlashInfer's SM120 kernels cannot be compiled, "
                          f"and image verify fails (fix: image.base {stacks.load(stacks.DEFAULT).base})")
    else:
        toolchain_text = f"{toolchain.name}: CUDA {toolchain.cuda} at {toolchain.cuda_home} ({toolchain.source})"
        if toolchain.lab_only:
            toolchain_text += f". LAB STAND-IN: {toolchain.why}"
    planned = aot_plan(host)
    built = {m.name for m in planned.modules}
    tag = image_tag(host, planned)
    return {
        "tag": tag, "stack": stack.name, "stack_why": stack.why, "stack_cuda": stack.cuda,
        "stack_driver_min": stack.driver_min, "profile": host.profile_name,
        "base": image.base_name, "base_why": catalog.why, "base_python": catalog.python,
        "base_digest": digest, "toolchain": toolchain_text, "gpu_model": image.gpu_model,
        "target_arch": planned.arch.cuda_arch,
        "flashinfer_aot": [{"name": m.name, "group": m.group, "why": m.why,
                            "ahead_of_time": m.name in built} for m in planned.wanted],
        "flashinfer_aot_note": planned.note,
        "jit_only": [{"what": item.what, "why": item.why} for item in stack.not_prebuilt],
        "jit_cache_volume": f"{jit_cache_volume(CONTAINER_NAME)} at {JIT_CACHE_MOUNT} (FlashInfer's workspace: "
                            "what is compiled at run time survives a container restart)",
        "build_on": image.build_on, "pins": image.pinned(), "server_image": server_image(host, tag),
        "lab_stand_in": image.lab_stand_in,
    }


def server_image(host: Host, tag: str | None = None) -> str:
    """What the server container runs: the content-tagged image (``tag`` when already computed), or
    in a lab with a stand-in the fake server's image (its tag hashes the fake's files)."""
    if host.image.lab_stand_in:
        from gpunode.lab.image import fake_tag

        return fake_tag()
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
        launch = profiles.Launch(launch.argv + ("--api-key", "<from " + host.server.api_key.describe() + ">"),
                                 launch.env, {**launch.reasons, "--api-key": "required when bound beyond loopback"})
    if host.image.lab_stand_in:
        # The stand-in parses the launch with the flags of the stack's sglang (gpunode/lab/standin/sglang_server.py).
        version = host.image.pinned()["sglang"]
        launch = profiles.Launch(launch.argv, {**launch.env, "FAKE_SGLANG_VERSION": version},
                                 {**launch.reasons, "FAKE_SGLANG_VERSION": f"lab: the stand-in server takes sglang "
                                  f"{version}'s flags, as the stack's server would"})
    return launch


@dataclass
class HostPlan:
    name: str
    lab: bool
    notes: list[str]
    warnings: list[str]
    api: dict[str, Any]
    node: dict[str, Any]
    host_changes: list[str]
    container: dict[str, Any]
    dev_rules: list[dict[str, str]]
    handoff: dict[str, Any]
    image: dict[str, Any]
    server: dict[str, Any]
    stages: list[dict[str, Any]] = field(default_factory=list)
    # Filled only by `plan --live`: whose container the vmid is (gpunode.pve.live.Ownership).
    ownership: dict[str, Any] | None = None


def plan_host(host: Host) -> HostPlan:
    notes: list[str] = []
    warnings: list[str] = []
    if host.lab:
        notes.append(
            f"LAB: the Proxmox API at {host.api.url} is fakepve, a schema-validating fake of PVE 9; "
            f"the node that later stages configure is the real lab LXC container at {host.container.reach.address}."
        )
    if host.api.auth.method == "token":
        warnings.append(
            "devN entries are root@pam only and an API token is refused even for root: the container stage "
            "will stop before any write. Use auth.method password (root@pam ticket) or local (pvesh on the host)."
        )
    if not host.api.tls.verify:
        warnings.append("TLS verification of the Proxmox API is OFF: anyone on the path can read the credentials")
    launch = server_launch(host)
    profile = profiles.load(host.profile_name)
    gpus = host.container.gpus
    if isinstance(gpus, list) and len(gpus) != profile.gpus:
        warnings.append(f"profile {profile.name} is tuned for {profile.gpus} GPUs; container.gpus selects {len(gpus)}")
    reach = host.container.reach
    return HostPlan(
        name=host.name,
        lab=host.lab,
        notes=notes,
        warnings=warnings,
        api={"url": host.api.url, "node": host.api.node, "auth": host.api.auth.method, "user": host.api.auth.user,
             "tls": "verify" + (f" with CA {host.api.tls.ca_file}" if host.api.tls.ca_file else "")
             + (f" pinned to {host.api.tls.fingerprint}" if host.api.tls.fingerprint else "")
             if host.api.tls.verify else "NOT verified"},
        node={"address": reach.address, "port": reach.port, "user": reach.user},
        host_changes=host_changes(host),
        container=container_config(host.container, host.name),
        dev_rules=[{"key": e.key, "value": e.value, "when": e.when} for e in dev_entries(host.container)],
        handoff=handoff(host),
        image=image_section(host),
        server={"profile": profile.name, "model": host.model.id, "model_path": str(host.model.path),
                "served_name": host.served_name, "bind": host.server.bind, "port": host.server.port,
                "command": launch.command_line(), "env": launch.env, "reasons": launch.reasons},
        stages=[{"name": s.name, "built": s.built, "summary": s.summary, "checks": list(s.checks)} for s in STAGES],
    )


def make_plan(hostfile: HostFile) -> list[HostPlan]:
    return [plan_host(host) for host in hostfile.hosts]


def as_json(plans: list[HostPlan]) -> str:
    return json.dumps({"hosts": [asdict(plan) for plan in plans]}, indent=2)
