"""What ``gpunode provision`` would do, shown from the host file and its derived values
(gpunode.derive) alone: nothing is contacted."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpunode.catalogue import profiles, stacks
from gpunode.derive import Derived, container_config, derive, derive_for, derive_router, dev_entries
from gpunode.derive.imagecontext import ImageInputError
from gpunode.ground.text import shown
from gpunode.ground.yamlsource import YamlSource
from gpunode.hostfile import Host, HostFile, at
from gpunode.hostfile import load as hostfile_load
from gpunode.catalogue import bases
from gpunode.ground.nvidia import CDI_SPEC_FILE, MOUNT_POINT, TREE_ROOT
from gpunode.derive.serverspec import CONTAINER_NAME, JIT_CACHE_MOUNT, jit_cache_volume
from gpunode.ground.stagelist import STAGES

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
                   "that needs it; the recap says whether it is safe to reboot. With the headers, python3-apt if "
                   "missing: Ansible's apt module needs it")
    changes.append("pins the newest kernel the module is built for (proxmox-boot-tool kernel pin) when the one that "
                   "boots next cannot get it" if prep.pin_kernel else
                   "never pins a kernel (prepare.pin_kernel): if the module cannot be built for the kernel that boots "
                   "next, the stage stops before any change")
    changes.append("reads the PCIe fabric under the GPUs (bridges, ACS, BAR1, the nvidia module's P2P keys, link "
                   "power) and names acs, bar1, p2p_mode and aspm findings; BAR1 is firmware's, never changed")
    changes.append("clears ACS redirect at boot on the downstream ports of switches shared by GPUs "
                   "(gpunode-pcie-acs.service, setpci)"
                   if prep.clear_acs else "leaves ACS as it is (prepare.clear_acs)")
    changes.append("for GPUs that share no PCIe switch: the nvidia module's P2P registry keys in "
                   "/etc/modprobe.d/gpunode-nvidia-p2p.conf (read at the next module load)"
                   if prep.p2p_registry else "never sets the nvidia module's P2P registry keys (prepare.p2p_registry)")
    changes.append("pcie_aspm=off pcie_port_pm=off on the kernel command line (from the next boot)"
                   if prep.link_power_off else "leaves PCIe link power management as it is (prepare.link_power_off)")
    if host.container.gpu_handoff == "host-driver":
        changes.append(f"the loaded driver's user space as a tree in {TREE_ROOT}/<version> (one per version; "
                       "the container stage removes those no container mounts)")
    if prep.allow_module_reload:
        changes.append("nvidia_uvm reloaded when its options change")
    changes.append("reboot when needed" if prep.allow_reboot else "never reboots: reports 'reboot needed' instead")
    return changes


# What the node stage installs with apt: roles/node's defaults node_base_packages and node_docker_packages,
# and debootstrap, which makes the probe image (its tasks/install.yml); tests/unit/test_plan.py holds them equal.
NODE_PACKAGES = ("ca-certificates", "curl", "gnupg", "python3-apt", "docker.io", "debootstrap")
NODE_STATE_DIR = "/etc/gpunode"  # roles/node's node_state_dir
PROBE_IMAGE = "gpunode/probe:bookworm-1"  # roles/node's node_probe_image


def node_changes(host: Host) -> list[str]:
    """What the node stage changes inside the container, said before it acts."""
    changes = [f"Debian's {', '.join(NODE_PACKAGES)} installed if missing (python3-apt: Ansible's apt module "
               "needs it; debootstrap makes the probe image), Docker Engine enabled and running"]
    if host.container.gpu_handoff == "nvidia-runtime":
        changes.append(f"NVIDIA's user space {host.driver.version} from its .run installer (no kernel module); NVIDIA's "
                       "apt key and repository, the pinned nvidia-container-toolkit, no-cgroups = true in its "
                       "config.toml, and the nvidia runtime in /etc/docker/daemon.json (the original kept beside it)")
    else:
        changes.append(f"the mounted driver tree on the loader's path (/etc/ld.so.conf.d/gpunode-nvidia.conf) and on "
                       f"PATH (/etc/profile.d/gpunode-nvidia.sh); {CDI_SPEC_FILE}, the CDI spec Docker hands the "
                       "GPUs and the driver's files through")
    changes.append(f"the probe image {PROBE_IMAGE}, made on the node from Debian if missing, and probe containers "
                   "started from it as the server is: device nodes, then CUDA")
    changes.append(f"what gpunode expects of this node in {NODE_STATE_DIR}/node.json")
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


def image_section(host: Host, derived: Derived | None = None) -> dict[str, Any]:
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
    derived = derived or derive(host)
    planned = derived.aot
    built = {m.name for m in planned.modules}
    tag = derived.image_tag
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
        "build_on": image.build_on, "pins": image.pinned(), "server_image": derived.server_image,
        "lab_stand_in": image.lab_stand_in,
    }


@dataclass
class HostPlan:
    name: str
    lab: bool
    notes: list[str]
    warnings: list[str]
    api: dict[str, Any]
    node: dict[str, Any]
    host_changes: list[str]
    node_changes: list[str]
    container: dict[str, Any]
    dev_rules: list[dict[str, str]]
    handoff: dict[str, Any]
    image: dict[str, Any]
    server: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    # Filled only by `plan --live` (gpunode.stages.container.live.Ownership): whose container the vmid is,
    # the Proxmox VE version and what a provision would apply at once or at the restart.
    ownership: dict[str, Any] | None = None
    # Filled only by `plan --live` (gpunode.rolling.forecast): what a provision would do to the server now.
    forecast: dict[str, str] | None = None
    monitor: dict[str, Any] | None = None  # the monitor stage, with the host file's monitor: section


def plan_host(host: Host, hostfile: HostFile | None = None) -> HostPlan:
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
    derived = derive_for(hostfile, host) if hostfile is not None else derive(host)
    launch = derived.launch
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
        node_changes=node_changes(host),
        container=container_config(host.container, host.name),
        dev_rules=[{"key": e.key, "value": e.value, "when": e.when} for e in dev_entries(host.container)],
        handoff=handoff(host),
        image=image_section(host, derived),
        server={"profile": profile.name, "model": host.model.id, "model_path": str(host.model.path),
                "served_name": host.served_name, "bind": host.server.bind, "port": host.server.port,
                "command": launch.command_line(), "env": launch.env, "reasons": launch.reasons},
        model=model_section(host, derived),
        stages=[{"name": s.name, "summary": s.summary, "checks": list(s.checks)} for s in STAGES
                if s.name != "router" and (s.name != "monitor" or host.monitor is not None)],
        monitor=monitor_section(host, derived),
    )


def monitor_section(host: Host, derived: Derived) -> dict[str, Any] | None:
    """What the monitor stage runs on the node, what it scrapes, where alerts go (a webhook by its
    address only: its path may carry the receiver's own secret) and how to reach Prometheus."""
    settings, monitor = derived.monitor, host.monitor
    if settings is None or monitor is None:
        return None
    alerts = []
    if monitor.alerts.webhook is not None:
        hook = monitor.alerts.webhook
        parts = urlsplit(hook.url)
        alerts.append(f"webhook {parts.scheme}://{parts.netloc}/..." + (f" with token {hook.token.describe()}" if hook.token else ""))
    if monitor.alerts.email is not None:
        mail = monitor.alerts.email
        alerts.append(f"email to {mail.to} through {mail.smarthost}" + (f" as {mail.username}" if mail.username else "")
                      + (f" with password {mail.password.describe()}" if mail.password else ""))
    reach = host.container.reach
    return {"runs": "Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter, and gpunode's GPU "
                    f"exporter ({settings.exporter_image}), on the node's loopback",
            "targets": list(settings.targets), "retention": monitor.retention,
            "scrape_interval_s": monitor.scrape_interval_s, "alerts": alerts,
            "reach": f"ssh -L 9090:{settings.web} -p {reach.port} {reach.user}@{reach.address}, then http://localhost:9090"}


def model_section(host: Host, derived: Derived) -> dict[str, Any]:
    """Where the weights come from, the pinned revision, where they are kept and mounted, how they
    are verified, and what --recreate-container does to them (nothing)."""
    m = derived.model
    where = {"hub": f"the Hub at {m.endpoint}, fetched by the model stage into the store on the Proxmox host",
             "host_path": "already on the Proxmox host (model.host_path), only verified",
             "node_path": "already inside the container (model.path), only verified"}[m.source]
    token = host.model.token.describe() if host.model.token is not None else None
    return {"source": m.source, "from": where, "repo": m.repo, "revision": m.revision, "token": token,
            "weights_dir": m.weights_dir, "on": m.on, "manifest": m.manifest,
            "mount": f"{m.mount_source} -> {m.mount_target} (read-only mpN)" if m.mount_source else None,
            "verify": m.verify,
            # What the stage installs there, said before it acts (README "The model").
            "tools": (f"Debian's python3-venv and python3-packaging (and python3-apt if missing: Ansible's apt "
                      f"module needs it), then a venv with the hash-locked huggingface_hub "
                      f"and safetensors in {m.tools_dir}, on the {'Proxmox host' if m.on == 'host' else 'node'}"),
            "recreate": ("--recreate-container keeps them: a bind mount's source is not the container's disk"
                         if m.mount_source else
                         "--recreate-container DESTROYS them with the container's disk (model.source: node_path)")}


def restart_note(hostfile: HostFile) -> str:
    """What a change that restarts a server (its image, flags, environment, key or hand-off) does to
    the serving: rolled behind a router, or a stop of the only server, said before it happens."""
    if hostfile.router is not None:
        return ("a change that restarts this server goes through the roll: taken out of the router and drained "
                "first, changed, put back once it serves, one batch of hosts at a time (router.rolling)")
    if len(hostfile.hosts) == 1:
        return ("a change that restarts this server stops the only server: nothing serves for the minutes a start "
                "takes (a second host behind a router would keep serving)")
    return ("a change that restarts the servers restarts every host's in the same run: with no router, nothing takes "
            "a server out of rotation first")


def make_plan(hostfile: HostFile) -> list[HostPlan]:
    plans = [plan_host(host, hostfile) for host in hostfile.hosts]
    for plan in plans:
        plan.server["restart"] = restart_note(hostfile)
    return plans


def router_plan(hostfile: HostFile) -> dict[str, Any] | None:
    """The router stage, when the host file has a router: where it runs, its image, flags and workers."""
    derived = derive_router(hostfile)
    router = hostfile.router
    if derived is None or router is None:
        return None
    where = (f"{derived.runs_on}'s GPU node ({derived.reach.address}), beside its server" if derived.runs_on
             else f"{derived.reach.user}@{derived.reach.address} (a machine of its own, with Docker Engine)")
    stage = next(s for s in STAGES if s.name == "router")
    return {"runs_on": where, "url": derived.url, "policy": router.policy,
            "api_key": router.api_key.describe() if router.api_key else None,
            "image": derived.image_tag, "image_base": router.image.base,
            "image_built_on": "this machine's engine, then shipped" if router.image.build_on == "local"
            else "the router machine's engine",
            "command": "python3 /opt/gpunode/router_launch.py " + " ".join(derived.argv)
            + (" (+ --api-key from the key file, never on the command line)" if router.api_key else ""),
            "metrics": f"127.0.0.1:{router.metrics_port} on the router machine (Prometheus; per-worker request counts)",
            "rolling": {"batch": router.rolling.batch, "max_fail_percent": router.rolling.max_fail_percent,
                        "drain_timeout_s": router.rolling.drain_timeout_s,
                        "order": [[host.name for host in hostfile.hosts[start:start + router.rolling.batch]]
                                  for start in range(0, len(hostfile.hosts), router.rolling.batch)],
                        "when": "a provision whose change restarts serving servers (plan --live says whose), or "
                                "--rolling; --all-at-once never"},
            "workers": [w.model_dump() for w in derived.workers],
            "stage": {"name": stage.name, "summary": stage.summary, "checks": list(stage.checks)}}


def as_json(plans: list[HostPlan], router: dict[str, Any] | None = None) -> str:
    return json.dumps({"hosts": [asdict(plan) for plan in plans], "router": router}, indent=2)


def plan_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """What ``gpunode plan`` computes beyond the host file's rules, so that a valid file always has
    a plan: each host's plan and the router's, each failure at its place in the file."""
    problems: list[str] = []
    for index, host in enumerate(hf.hosts):
        try:
            plan_host(host)
        except (ImageInputError, ValueError, LookupError) as exc:
            problems.append(at(src, ("hosts", index), f"plan cannot be made: {shown(str(exc), limit=240)}"))
    try:
        router_plan(hf)
    except (ImageInputError, ValueError, LookupError) as exc:
        problems.append(at(src, ("router",), f"plan cannot be made: {shown(str(exc), limit=240)}"))
    return problems


def load(path: Path) -> HostFile:
    """A host file loaded, validated and planned: what every command that reads one starts from
    (gpunode.hostfile.load, with the plan as its last rule)."""
    return hostfile_load(path, plan_problems)
