"""`gpunode plan --live`: read (never write) the Proxmox API to say whose container the host
file's vmid is, the Proxmox VE version, and what a provision would apply to the container at once
and what would wait for its restart. plan stays contact-free without --live."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection, PveClient
from gpunode.derive import container_config
from gpunode.derive.modelplan import plan as model_plan
from gpunode.hostfile import Host
from gpunode.ground.nvidia import CAPS_DIR, CONTROL_NODES, DEV_MODE, OPTIONAL_NODES, TREE_ROOT

ALL_GPUS_NOTE = ("devN: container.gpus is 'all', so the GPUs are the nodes provision finds on the host (plan --live "
                 "reads only the API): a GPU the container lacks gets a new key, a removed one's key is deleted")
LISTED_NOTE = ("devN from container.gpus and the control nodes; nvidia-modeset and MIG nodes as the container has "
               "them (provision reads the host's own nodes)")


@dataclass(frozen=True)
class Ownership:
    vmid: int
    owner: Literal["free", "gpunode", "foreign"]
    detail: str
    pve_version: str = ""
    hotplug_rule: str = ""  # the version's devN/mpN/features rule, one line
    applies_live: tuple[str, ...] = ()  # keys a provision would change at once
    applies_at_restart: tuple[str, ...] = ()  # keys that would wait for the restart (or wait already)
    devices_note: str = ""  # what the API alone cannot tell about the devN

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def connection(host: Host) -> Connection:
    """The API connection a run would use; LookupError names a secret that cannot be read here."""
    auth, tls = host.api.auth, host.api.tls
    password = auth.password.resolve() if auth.password is not None else None
    token_secret = auth.token_secret.resolve() if auth.token_secret is not None else None
    return Connection(url=host.api.url, node=host.api.node, method=auth.method, user=auth.user, password=password,
                      token_id=auth.token_id, token_secret=token_secret, verify=tls.verify,
                      ca_file=str(tls.ca_file.expanduser()) if tls.ca_file else None, fingerprint=tls.fingerprint)


def wanted(host: Host, live: dict[str, Any]) -> tuple[lxc.Wanted, str]:
    """What provision would converge to, as far as the host file tells without the host's nodes,
    and a note on the devN it cannot know."""
    container = host.container
    mounts = (lxc.driver_mount(f"{TREE_ROOT}/{host.driver.version}") if container.gpu_handoff == "host-driver"
              else {})
    model = model_plan(host)
    mounts = {**mounts, **lxc.model_mount(model.mount_source, model.mount_target)}
    config = container_config(container, host.name, with_devices=False)
    if container.gpus == "all":
        return lxc.Wanted(config, mounts, None, None), ALL_GPUS_NOTE
    listed = [f"/dev/nvidia{minor}" for minor in container.gpus] + list(CONTROL_NODES)
    have = [lxc.device_path(value) for key, value in live.items() if lxc.DEV_KEY.match(key)]
    kept = [path for path in have if path in OPTIONAL_NODES or (container.mig and path.startswith(f"{CAPS_DIR}/"))]
    devices = {path: f"{path},mode={DEV_MODE}" for path in listed + kept}
    return lxc.Wanted(config, mounts, devices, None), LISTED_NOTE


def applies(client: PveClient, ct: lxc.Converger, live: dict[str, Any], host: Host | None) -> dict[str, Any]:
    """The version, its rule, and (given the host) which keys a provision would apply live and
    which would wait for a restart, by the version's hot-plug rules (lxc.hotplug)."""
    version = client.version()
    out: dict[str, Any] = {"pve_version": str(version), "hotplug_rule": lxc.hotplug_rule(version)}
    if host is None:
        return out
    running = ct.status().get("status") == "running"
    current = ct.config(current=True) if running else live
    want, note = wanted(host, live)
    changes = lxc.compare(live, want.against(live, current))
    how = {c.key: lxc.hotplug(version, c, running, current) for c in changes}
    waiting = set(ct.pending()) if running else set()
    out["applies_live"] = tuple(sorted((k for k, h in how.items() if h == "live" and k not in waiting),
                                       key=_order))
    out["applies_at_restart"] = tuple(sorted(waiting | {k for k, h in how.items() if h == "restart"}, key=_order))
    out["devices_note"] = note
    return out


def _order(key: str) -> tuple[str, int]:
    stem = key.rstrip("0123456789")
    return stem, int(key[len(stem):] or -1)


def ownership(client: PveClient, node: str, vmid: int, host: Host | None = None) -> Ownership:
    """Free, gpunode's, or someone else's, with the Proxmox version and (given ``host``) what a
    provision would apply live or at the restart; reads only."""
    ct = lxc.Converger(client, node, vmid)
    if not ct.exists():
        version = client.version()
        return Ownership(vmid, "free", f"container {vmid} does not exist: provision will create it",
                         str(version), lxc.hotplug_rule(version))
    config = ct.config()
    facts = applies(client, ct, config, host)
    if lxc.owned(config):
        return Ownership(vmid, "gpunode", f"container {vmid} (hostname {config.get('hostname', '?')}) is gpunode's: "
                                          f"{lxc.first_line(config.get('description'))}", **facts)
    return Ownership(vmid, "foreign", lxc.foreign_message(vmid, config, ct.status(), refused=False), **facts)


def inspect(host: Host) -> Ownership:
    return ownership(PveClient(connection(host)), host.api.node, host.container.vmid, host)
