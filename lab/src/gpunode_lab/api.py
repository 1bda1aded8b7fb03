"""The lab's verbs: up (idempotent), down, status."""

from __future__ import annotations

import os
import re
import shutil
import time

from gpunode_lab.containers import (
    cgroup_device_key, container_state, ensure_container, ensure_model_stand_in, ensure_server_stand_in,
    ssh_works, stop_container,
)
from gpunode_lab.contract import (
    BRIDGE, BRIDGE_CIDR, BRIDGE_IP, CONTAINER_IP, CONTAINER_NAME, FLEET_API_KEY, GPU_CONTAINER, HOST_CONTAINER,
    HOST_CONTAINER_IP, HOST_CONTAINER_NAME, KNOWN_HOSTS, LAB_CONTAINERS, LAB_DIR, LAB_GPU_COUNT,
    LAB_HOST_FACTS_ROOT, LXC_PATH, LabContainer, LabError, LabInfo, LabSite, PVE_CA, PVE_NODE, PVE_PASSWORD_FILE,
    PVE_URL, PVE_USER, Progress, REQUIRED_COMMANDS, SITE, SITES, SSH_KEY,
)
from gpunode_lab.devices import device_nodes, ensure_devices
from gpunode_lab.engine import docker_running, ensure_docker
from gpunode_lab.fakepve import ensure_pve, pve_answers, stop_pve
from gpunode_lab.network import bridge_state, ensure_network, iptables_rules, remove_network
from gpunode_lab.util import locked, lxc, noop, ok, require_commands, require_root, run, write_if_changed
from gpunode_lab import hubservice, kernels

def _info(uvm: int, changed: list[str], seconds: float) -> LabInfo:
    return LabInfo(
        lab_dir=str(LAB_DIR), container=CONTAINER_NAME, container_ip=CONTAINER_IP,
        host_container=HOST_CONTAINER_NAME, host_ip=HOST_CONTAINER_IP, host_facts_root=LAB_HOST_FACTS_ROOT,
        lxc_path=str(LXC_PATH),
        ssh_user="root", ssh_key=str(SSH_KEY), known_hosts=str(KNOWN_HOSTS), bridge=BRIDGE, gateway=BRIDGE_IP,
        gpu_count=LAB_GPU_COUNT,
        device_nodes={n: f"{ma}:{mi}" for n, (ma, mi) in device_nodes(uvm).items()},
        uvm_major=uvm, cgroup_key=cgroup_device_key(), pve_url=PVE_URL, pve_user=PVE_USER,
        pve_password_file=str(PVE_PASSWORD_FILE), pve_ca=str(PVE_CA), pve_node=PVE_NODE,
        changed=changed, seconds=round(seconds, 1))


def up(progress: Progress = noop) -> LabInfo:
    """Bring the lab up (idempotent: a second run changes nothing); returns how to reach it."""
    start = time.monotonic()
    require_root()
    require_commands(list(REQUIRED_COMMANDS))
    changed: list[str] = []
    with locked():
        if ensure_docker(progress):
            changed.append("docker")
        if ensure_network(progress):  # after dockerd, which rewrites iptables
            changed.append("network")
        dev_changed, uvm = ensure_devices(progress)
        if dev_changed:
            changed.append("devices")
        if ensure_server_stand_in(progress):
            changed.append("server_image")
        if _ensure_fleet_key(progress):
            changed.append("fleet_api_key")
        for site in SITES:
            suffix = "" if site == SITE else f"@{site.name}"
            if ensure_container(progress, site.gpu, uvm):
                changed.append("container" + suffix)
            if ensure_model_stand_in(progress, site.gpu, wanted=not site.hub):
                changed.append("model" + suffix)
            if ensure_pve(progress, site):
                changed.append("fakepve" + suffix)
            if ensure_container(progress, site.host, uvm):
                changed.append("host_container" + suffix)
            if site.hub and hubservice.ensure(progress, site.host):
                changed.append("hub" + suffix)
            if kernels.ensure(progress, site.host.ip, repair=site.kernels):
                changed.append("kernels" + suffix)
    seconds = time.monotonic() - start
    progress(f"lab up in {seconds:.1f} s" + (f" (changed: {', '.join(changed)})" if changed else " (no change)"))
    return _info(uvm, changed, seconds)


def _ensure_fleet_key(progress: Progress) -> bool:
    """The API key the fleet's servers and router share (inventory/lab/fleet.yml): random, 0600, and
    always beginning with ``-``: such a key (one token_urlsafe in 64) once broke the servers' and the
    router's launch, so every lab run proves that it no longer does."""
    import secrets as tokens

    if FLEET_API_KEY.is_file() and FLEET_API_KEY.read_text().startswith("-"):
        return False
    FLEET_API_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_if_changed(FLEET_API_KEY, "-" + tokens.token_urlsafe(24), 0o600)
    progress(f"fleet: API key written to {FLEET_API_KEY}")
    return True


def down(purge: bool = False, progress: Progress = noop) -> None:
    """Take the lab apart: each site's fakepve and containers, the iptables rules and the bridge; with purge
    also LAB_DIR (keys, certificates, the debootstrap cache). Docker Engine is left running."""
    require_root()
    require_commands(["ip", "iptables", "lxc-stop", "lxc-destroy", "lxc-info"])
    if not LAB_DIR.exists():
        remove_network(progress)
        progress("lab: nothing else to remove")
        return
    with locked():
        for site in SITES:
            progress(f"fakepve {site.pve_url}: stopped" if stop_pve(site) else f"fakepve {site.pve_url}: not running")
        for ct in reversed(LAB_CONTAINERS):
            state = container_state(ct)
            if state != "ABSENT":
                if state != "STOPPED":
                    stop_container(progress, ct)
                run(lxc(ct, "lxc-destroy"), timeout=300, what=f"lxc-destroy {ct.name}")
                progress(f"container: {ct.name} destroyed")
            else:
                progress(f"container: {ct.name} absent")
        KNOWN_HOSTS.unlink(missing_ok=True)
        remove_network(progress)
    if purge:
        shutil.rmtree(LAB_DIR)
        progress(f"lab: {LAB_DIR} removed")


def _devices_in_container(ct: LabContainer = GPU_CONTAINER) -> dict[str, str]:
    """name -> "major:minor" of the /dev/nvidia* char nodes inside the running container."""
    proc = run(lxc(ct, "lxc-attach", "--", "sh", "-c", "stat -c '%n %F %t %T' /dev/nvidia* 2>/dev/null || true"),
                check=False, timeout=20)
    seen: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"/dev/(\S+) character special file ([0-9a-f]+) ([0-9a-f]+)$", line.strip())
        if m:
            seen[m.group(1)] = f"{int(m.group(2), 16)}:{int(m.group(3), 16)}"
    return seen


def _container_status(ct: LabContainer, root: bool) -> dict[str, object]:
    """name, lxc_path, state, ip, devices ("name" -> "major:minor" inside), ssh, and ok (all fine)."""
    state = container_state(ct) if root else "UNKNOWN"
    ip = None
    devices: dict[str, str] = {}
    if state == "RUNNING":
        proc = run(lxc(ct, "lxc-info", "-iH"), check=False, timeout=20)
        ips = proc.stdout.split()
        ip = ips[0] if ips else None
        devices = _devices_in_container(ct)
    ssh = state == "RUNNING" and KNOWN_HOSTS.exists() and ssh_works(ct)
    return {"name": ct.name, "lxc_path": str(LXC_PATH), "state": state, "ip": ip, "devices": devices, "ssh": ssh,
            "ok": state == "RUNNING" and ip == ct.ip and ssh}


def _site_status(site: LabSite, root: bool, expected: dict[str, str]) -> dict[str, object]:
    """A further site of the fleet: its GPU node, host container and fakepve, with ok (all fine)."""
    gpu = _container_status(site.gpu, root)
    host = _container_status(site.host, root)
    facts = (site.host.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/") / "proc/driver/nvidia/version").is_file()
    answering = site.pve_password_file.exists() and pve_answers(site)
    gpu_ok, host_ok = gpu.pop("ok"), host.pop("ok")
    ok = bool(gpu_ok and gpu["devices"] == expected and host_ok and host["devices"] == expected and facts and answering)
    return {"gpu_node": gpu, "host_container": {**host, "facts": facts},
            "fakepve": {"url": site.pve_url, "node": PVE_NODE, "answering": answering}, "ok": ok}


def status() -> dict[str, object]:
    """What is there now, as a JSON-able dict; `up` is True when every part works. Never raises."""
    out: dict[str, object] = {"lab_dir": str(LAB_DIR), "root": os.geteuid() == 0}
    try:
        out["dockerd"] = docker_running()
        exists, has_addr, is_up = bridge_state()
        out["bridge"] = {"name": BRIDGE, "present": exists, "address": BRIDGE_CIDR if has_addr else None,
                         "up": is_up}
        out["iptables"] = all(ok(["iptables", "-w", "-t", t, "-C", *spec]) for t, spec, _ in iptables_rules())
        try:
            expected = {n: f"{ma}:{mi}" for n, (ma, mi) in device_nodes().items()}
        except (OSError, LabError):
            expected = {}
        gpu = _container_status(GPU_CONTAINER, out["root"] is True)
        out["container"] = {k: gpu[k] for k in ("name", "lxc_path", "state")}
        out["container_ip"] = gpu["ip"]
        out["devices_expected"] = expected
        out["devices"] = gpu["devices"]
        out["ssh"] = gpu["ssh"]
        host = _container_status(HOST_CONTAINER, out["root"] is True)
        host["facts_root"] = LAB_HOST_FACTS_ROOT
        host["facts"] = (HOST_CONTAINER.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/") / "proc/driver/nvidia/version").is_file()
        out["host_container"] = host
        out["fakepve"] = {"url": PVE_URL, "node": PVE_NODE, "answering": PVE_PASSWORD_FILE.exists() and pve_answers()}
        others = {site.name: _site_status(site, out["root"] is True, expected) for site in SITES if site != SITE}
        out["sites"] = others
        out["up"] = bool(out["dockerd"] and exists and has_addr and is_up and out["iptables"] and expected
                         and gpu["ok"] and gpu["devices"] == expected
                         and host["ok"] and host["devices"] == expected and host["facts"]
                         and out["fakepve"]["answering"]  # type: ignore[index]
                         and all(site.pop("ok") for site in others.values()))
        gpu.pop("ok")
        host.pop("ok")
    except (OSError, LabError) as exc:
        out["error"] = str(exc)
        out["up"] = False
    return out
