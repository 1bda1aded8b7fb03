"""Converge one LXC container to its desired Proxmox config: create, update, start; never destroy
unless asked. Pure logic over PveClient, so check mode and every fault path are testable against
fakepve without Ansible.

Ownership: every container gpunode creates carries the ``gpunode`` tag and a description line
naming the host file's host (both kept and shown by Proxmox). An existing container without the
tag is someone else's: nothing is written to it unless the operator adopts it (``adopt``), and it
is never destroyed, adopted or not (adopt first, re-create in a later run).

Keys that do not move: a device path keeps the devN key that holds it in the live config (as a
bind mount keeps its mpN by target), a new path takes the lowest free key, a path no longer
wanted has its key deleted. So adding GPUs to a running container only adds keys, which Proxmox
VE 9 hot-plugs (``hotplug`` below has the rules per version).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpunode.ground.marks import MARK_PREFIX, OWNER_TAG, mark_line
from gpunode.ground.nvidia import CAPS_DIR, CONTROL_NODES, DEV_MODE, MOUNT_POINT, OPTIONAL_NODES
from gpunode.stages.container.causes import HOST_STAGE_FIX
from gpunode.stages.container.client import PveClient, PveError, PveUnreachable, PveVersion, TaskFailed

DEV_KEY = re.compile(r"^dev\d+$")
MP_KEY = re.compile(r"^mp\d+$")
MAX_MP = 256  # mp0..mp255 (pve-container's MAX_MOUNT_POINTS)
MAX_DEV = 256  # dev0..dev255 (pve-container src/PVE/LXC/Config.pm $MAX_DEVICES, line 39)
# gpunode's devN entries are the NVIDIA nodes it hands in (nvidia_device_facts finds exactly these:
# /dev/nvidiaN, the control and optional nodes, MIG's capability nodes); a devN for any other path,
# /dev/nvidia-nvswitch* or IMEX channels included, is the operator's and stays.
_GPU_NODE = re.compile(r"^/dev/nvidia\d+$")


def managed(path: str) -> bool:
    """Whether a devN path is one of the NVIDIA nodes gpunode passes through."""
    return bool(_GPU_NODE.match(path)) or path in CONTROL_NODES or path in OPTIONAL_NODES or \
        path.startswith(f"{CAPS_DIR}/")
# Written only at creation (Proxmox keeps no record of them in the config).
CREATE_ONLY = ("ostemplate", "ssh-public-keys", "vmid")
# Can only change by re-creating the container.
IMMUTABLE = ("unprivileged",)
# pve-container src/PVE/LXC.pm check_ct_modify_config_perm (line 1655): devN and bind mounts, and
# every feature flag but nesting (gpunode sets keyctl), privileged container or not (lines 1690-1732).
TOKEN_REFUSED = (
    "devN device passthrough, bind mount points and feature flags other than nesting (gpunode sets keyctl, "
    "on an unprivileged container too) are root@pam only, and an API token "
    "is refused even for root (API tokens are always a subset of their user): use auth.method password "
    "(a root@pam ticket) or auth.method local (pvesh on the Proxmox host)"
)
# Compared by inclusion, not equality: an operator may add tags and description lines of their own.
MARK_KEYS = ("tags", "description")
# What Proxmox means when a key is absent from the config (it stores only non-defaults).
ABSENT_MEANS = {"unprivileged": "0", "onboot": "0", "protection": "0"}
SIZE_UNITS = {"K": 1 / 1024 / 1024, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def props(value: str) -> dict[str, str]:
    """Parse a Proxmox property string (``a=1,b=2`` or ``volume,size=8G``) into a dict."""
    out: dict[str, str] = {}
    for index, part in enumerate(str(value).split(",")):
        if not part:
            continue
        key, sep, val = part.partition("=")
        if sep:
            out[key.strip()] = val.strip()
        else:
            out["_" if index == 0 else part] = part
    return out


def tag_list(value: Any) -> list[str]:
    """Proxmox's tags property: separated by ';' (the API also accepts ',' and spaces)."""
    return [tag for tag in re.split(r"[;, ]+", str(value or "").strip().lower()) if tag]


def owned(config: Mapping[str, Any]) -> bool:
    return OWNER_TAG in tag_list(config.get("tags"))


def first_line(text: Any, width: int = 80) -> str:
    line = next((part.strip() for part in str(text or "").splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def foreign_message(vmid: int, config: Mapping[str, Any], status: Mapping[str, Any], refused: bool = True) -> str:
    """One line naming someone else's container and the ways out (``refused``: a run that stopped
    before writing says so; plan and check only report)."""
    description = first_line(config.get("description"))
    return (f"container {vmid} (hostname {config.get('hostname', '?')}, {status.get('status', 'status unknown')}, "
            f"description {description!r}) was not made by gpunode (no '{OWNER_TAG}' tag): "
            + ("nothing was changed; " if refused else "")
            + "fix container.vmid in the host file, or re-run with --adopt to take it over deliberately")


class NotOwned(PveError):
    """The container exists and is not gpunode's: refused before any write."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 409)


def size_gb(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", str(text).strip())
    if not match:
        return 0.0
    return float(match.group(1)) * SIZE_UNITS.get(match.group(2) or "G", 1.0)


@dataclass(frozen=True)
class Change:
    key: str
    before: str | None
    after: str | None
    how: str  # "set", "delete", "resize", "recreate"


Applies = Literal["live", "restart"]
# What a running container takes at once (pve-container src/PVE/LXC/Config.pm: $LXC_FASTPLUG_OPTIONS,
# line 1612, then vmconfig_hotplug_pending, line 1624: cgroup limits and netN are changed live).
FASTPLUG = frozenset({"description", "onboot", "startup", "protection", "hostname", "hookscript", "cores", "tags",
                      "lock"})
CGROUP_LIVE = frozenset({"memory", "swap", "cpulimit", "cpuunits"})
NET_KEY = re.compile(r"^net\d+$")
NET_ADDED = frozenset({"hwaddr", "type"})  # what Proxmox writes into a netN line itself
# devN hot-plug (only adding one) came with pve-container 6.0.4 (commit c702167 "implement device
# hotplug"), first shipped in Proxmox VE 9.0; PVE 8 hot-plugs no devN.
DEV_HOTPLUG_SINCE = (9, 0)


def hotplug(version: PveVersion, change: Change, running: bool, current: Mapping[str, Any] | None = None) -> Applies:
    """Whether Proxmox ``version`` applies ``change`` at once or at the container's next start.

    A stopped container takes every change into its config at once (vmconfig_apply_pending).
    On a running one (vmconfig_hotplug_pending): the FASTPLUG keys, cgroup limits and netN live;
    a NEW mpN live, and since PVE 9.0 a new devN, while a changed or deleted one is skipped
    ("don't try to hotplug over existing mp/dev"); everything else (features, ...) at the start.
    ``current``: the container's current config (not its pending view), which is what "new" means
    to Proxmox; without it, a key the live view lacks counts as new. A change that only undoes a
    pending one (setting the value the container runs with, deleting a key it does not run with)
    is dropped by Proxmox's cleanup_pending at once (pve-guest-common AbstractConfig.pm).
    """
    if not running or change.how == "resize":  # the disk grows online (PUT .../resize)
        return "live"
    if change.how == "recreate":
        return "restart"
    key = change.key
    if key in FASTPLUG or key in CGROUP_LIVE or NET_KEY.match(key):
        return "live"
    if current is not None and (
            (change.how == "set" and key in current and _same(key, str(current[key]), change.after))
            or (change.how == "delete" and key not in current)):
        return "live"
    new = change.how == "set" and (key not in current if current is not None else change.before is None)
    if MP_KEY.match(key):
        return "live" if new else "restart"
    if DEV_KEY.match(key):
        return "live" if new and version.at_least(*DEV_HOTPLUG_SINCE) else "restart"
    return "restart"


def hotplug_rule(version: PveVersion) -> str:
    """The devN/mpN/features rule of ``version`` on a running container, in one line."""
    if version.at_least(*DEV_HOTPLUG_SINCE):
        return (f"Proxmox VE {version} applies a new device (devN) or mount point (mpN) to a running container at "
                f"once; a changed or removed one, and features, wait for its next start")
    return (f"Proxmox VE {version} hot-plugs no device (devN) into a running container (that came with PVE 9.0): "
            f"every devN change, a changed or removed mount point (mpN) and features wait for its next start; "
            f"a new mpN is applied at once")


@dataclass
class Result:
    vmid: int
    changed: bool = False
    created: bool = False
    started: bool = False
    adopted: bool = False
    restarted: bool = False
    restart_needed: bool = False
    changes: list[Change] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    pve_version: str = ""
    # Each changed key: "live" (applied to the running container, or to a stopped one's config)
    # or "restart" (waits for the next start); predicted in check mode, read back otherwise.
    applies: dict[str, str] = field(default_factory=dict)


def _same(key: str, live: str | None, want: str | None) -> bool:
    if live is None or want is None:
        return live == want
    if key == "rootfs":
        a, b = props(live), props(want)
        return a.get("_", "").split(":")[0] == b.get("_", "").split(":")[0] and size_gb(a.get("size", "0")) == size_gb(b.get("size", "0"))
    if key.startswith("net"):
        # Proxmox adds hwaddr and type (pve-container src/PVE/LXC/Config.pm parse_lxc_network, line 1566); every other
        # setting is the host file's, both ways: an ip6 or gw the host file no longer gives goes.
        a, b = props(live), props(want)
        return {k: v for k, v in a.items() if k not in NET_ADDED} == {k: v for k, v in b.items() if k not in NET_ADDED}
    if key == "features" or DEV_KEY.match(key) or MP_KEY.match(key):
        return props(live) == props(want)
    if key == "tags":
        return set(tag_list(want)) <= set(tag_list(live))
    if key == "description":
        return str(want).strip() in [line.strip() for line in str(live).splitlines()]
    return str(live) == str(want)


def merged_mark(key: str, live: str | None, want: str) -> str:
    """Add gpunode's tag or description line to what the container has, keeping the rest."""
    if key == "tags":
        have = tag_list(live)
        return ";".join(have + [tag for tag in tag_list(want) if tag not in have])
    # Our earlier line (another host name, say) is replaced; everyone else's lines stay below it.
    rest = [line for line in str(live or "").splitlines() if not line.strip().startswith(MARK_PREFIX)]
    return "\n".join([want] + rest).rstrip("\n")


def desired_rootfs(storage: str, disk_gb: int) -> str:
    return f"{storage}:{disk_gb}"


def compare(live: Mapping[str, Any], desired: Mapping[str, Any | None]) -> list[Change]:
    """What differs between the live config and the desired one, key by key; a desired value of
    None deletes the key (``place_devices`` gives those)."""
    changes: list[Change] = []
    for key, value in desired.items():
        if key in CREATE_ONLY:
            continue
        if value is None:
            if live.get(key) is not None:
                changes.append(Change(key, str(live[key]), None, "delete"))
            continue
        want = str(value)
        have = str(live[key]) if live.get(key) is not None else ABSENT_MEANS.get(key)
        if key == "rootfs":
            storage, _, gb = want.partition(":")
            want_cmp = f"{storage}:x,size={gb}G"
            if have is not None and not _same(key, have, want_cmp):
                live_props = props(have)
                live_storage = live_props.get("_", "").split(":")[0]
                if live_storage != storage or size_gb(live_props.get("size", "0")) > float(gb):
                    changes.append(Change(key, have, f"{storage}:{gb}G", "recreate"))
                else:
                    changes.append(Change(key, have, f"{gb}G", "resize"))
            continue
        if key in MARK_KEYS and have is None:
            have = ""
        if not _same(key, have, want):
            if key in MARK_KEYS:
                want = merged_mark(key, have, want)
            changes.append(Change(key, have, want, "recreate" if key in IMMUTABLE and have is not None else "set"))
    return changes


def bind_mount(source: str, target: str, read_only: bool = True) -> str:
    """An mpN value for a host directory bind-mounted into the container."""
    return f"{source},mp={target}" + (",ro=1" if read_only else "")


def driver_mount(tree: str) -> dict[str, str]:
    """The host's driver tree, read-only at MOUNT_POINT: ``mounts`` for ensure()."""
    return {MOUNT_POINT: bind_mount(tree, MOUNT_POINT)}


def model_mount(source: str | None, target: str) -> dict[str, str]:
    """The weights' folder on the host, read-only at model.path: the model stage fills it from the
    host, the container and its server only read it; none for weights inside the container."""
    return {target: bind_mount(source, target)} if source else {}


def place_mounts(live: Mapping[str, Any], mounts: Mapping[str, str]) -> dict[str, str]:
    """mpN keys for bind mounts given by target path: the key that already mounts that target,
    else the lowest free one; the operator's other mount points keep their keys."""
    placed: dict[str, str] = {}
    taken = {key for key in live if MP_KEY.match(key)}
    for target, value in sorted(mounts.items()):
        key = next((k for k in sorted(taken, key=lambda k: int(k[2:])) if props(str(live[k])).get("mp") == target), None)
        if key is None:
            key = next(f"mp{n}" for n in range(MAX_MP) if f"mp{n}" not in taken and f"mp{n}" not in placed)
        placed[key] = value
    return placed


def device_path(value: Any) -> str:
    """The host path of a devN value (``[path=]/dev/...[,mode=...]``)."""
    parsed = props(str(value))
    return parsed.get("path") or parsed.get("_", "")


def _key_number(key: str) -> int:
    return int(re.sub(r"^\D+", "", key))


def place_devices(live: Mapping[str, Any], devices: Mapping[str, str],
                  current: Mapping[str, Any] | None = None) -> dict[str, str | None]:
    """devN keys for ``devices`` (value by host path) against the live config: the key that already
    passes a path keeps it, a new path takes the lowest free key (in ``devices``' order), and each
    other devN of an NVIDIA node gpunode manages gets None (deleted), as does a second key for the
    same path. The operator's devN for other devices keep their keys, untouched. ``current``: the
    config the running container has (its pending deletes still in it): a path whose key waits
    to be deleted there takes that key back, which cancels the delete, and those keys are not free."""
    placed: dict[str, str | None] = {}
    held: dict[str, str] = {}  # path -> the key that keeps it
    for key in sorted((k for k in live if DEV_KEY.match(k)), key=_key_number):
        path = device_path(live[key])
        if path in devices and path not in held:
            held[path] = key
            placed[key] = devices[path]
        elif managed(path):
            placed[key] = None
    running = current or {}
    for key in sorted((k for k in running if DEV_KEY.match(k) and k not in live), key=_key_number):
        path = device_path(running[key])
        if path in devices and path not in held:  # its delete is pending: setting it again undoes that
            held[path] = key
            placed[key] = devices[path]
    taken = {key for key in [*live, *running] if DEV_KEY.match(key)}
    free = (f"dev{n}" for n in range(MAX_DEV) if f"dev{n}" not in taken)
    for path, value in devices.items():
        if path not in held:
            key = next(free, None)
            if key is None:
                raise PveError(f"no free devN key for {path}: a container has at most {MAX_DEV} (dev0..dev{MAX_DEV - 1})")
            placed[key] = value
    return dict(sorted(placed.items(), key=lambda item: _key_number(item[0])))


def lost_nodes(config: Mapping[str, Any], host_nodes: Collection[str]) -> dict[str, str]:
    """gpunode's devN entries (key -> path) whose node the Proxmox host does not have."""
    found = set(host_nodes)
    return {key: device_path(value) for key, value in config.items()
            if DEV_KEY.match(key) and managed(device_path(value)) and device_path(value) not in found}


def mounted_sources(client: PveClient, node: str, under: str) -> list[str]:
    """Bind-mount sources below ``under`` that any container on the node mounts, live or pending
    (what must not be removed from the host yet)."""
    prefix = under.rstrip("/") + "/"
    found: set[str] = set()
    for guest in client.get(f"nodes/{node}/lxc"):
        for row in client.get(f"nodes/{node}/lxc/{guest['vmid']}/pending"):
            if not MP_KEY.match(str(row.get("key", ""))):
                continue
            for value in (row.get("value"), row.get("pending")):
                source = str(value or "").split(",")[0]
                if source.startswith(prefix):
                    found.add(source)
    return sorted(found)


def _keep_hwaddr(live: Mapping[str, Any], key: str, value: str) -> str:
    """Re-use the live MAC address when net0 changes, so DHCP leases and ARP caches stay valid."""
    hw = props(str(live.get(key, ""))).get("hwaddr")
    return f"{value},hwaddr={hw}" if hw and "hwaddr=" not in value else value


class Converger:
    def __init__(self, client: PveClient, node: str, vmid: int, log: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.node = node
        self.vmid = vmid
        self.base = f"nodes/{node}/lxc"
        self.log = log or (lambda _: None)

    # -- reads ------------------------------------------------------------------------------
    def exists(self) -> bool:
        return any(int(ct["vmid"]) == self.vmid for ct in self.client.get(self.base))

    def status(self) -> dict[str, Any]:
        return dict(self.client.get(f"{self.base}/{self.vmid}/status/current"))

    def config(self, current: bool = False) -> dict[str, Any]:
        """The config with its pending changes applied, or (``current``) as the container runs now."""
        params = {"current": 1} if current else {}
        data = dict(self.client.get(f"{self.base}/{self.vmid}/config", **params))
        data.pop("digest", None)
        return data

    def pending(self) -> list[str]:
        rows = self.client.get(f"{self.base}/{self.vmid}/pending")
        return sorted(str(row["key"]) for row in rows if "pending" in row or row.get("delete"))

    def active_create_task(self) -> str | None:
        """UPID of a create task still running for this container, if any."""
        tasks = self.client.get(f"nodes/{self.node}/tasks", vmid=self.vmid, source="active")
        for task in tasks:
            if str(task.get("type")) in ("vzcreate", "vzrestore") and task.get("status", "running") == "running":
                return str(task["upid"])
        return None

    # -- writes -----------------------------------------------------------------------------
    def _task(self, method: str, path: str, **params: Any) -> None:
        upid = self.client.call(method, path, **params)
        if isinstance(upid, str) and upid.startswith("UPID:"):
            self.client.wait_task(upid)

    def create(self, params: dict[str, Any]) -> None:
        self._task("POST", self.base, **params)

    def destroy(self) -> None:
        self._task("DELETE", f"{self.base}/{self.vmid}", purge=1, force=1)

    def start(self) -> None:
        self._task("POST", f"{self.base}/{self.vmid}/status/start")

    def stop(self) -> None:
        self._task("POST", f"{self.base}/{self.vmid}/status/stop")

    def wait_running(self, timeout_s: float = 60.0, poll_s: float = 0.2) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while self.status().get("status") != "running":
            if time.monotonic() > deadline:
                raise PveError(f"container {self.vmid} did not reach 'running' within {timeout_s:.0f} s")
            self.client.sleep(poll_s)


@dataclass(frozen=True)
class Wanted:
    """What a run converges the container to: its config, bind mounts by target, devices by path."""

    config: dict[str, Any]
    mounts: dict[str, str]
    devices: dict[str, str] | None  # None: the container's devN are left as they are
    host_nodes: frozenset[str] | None  # the host's character device nodes, when known

    def fresh(self) -> dict[str, Any]:
        """A new container's config: mounts and devices take the lowest keys, in order."""
        base = self.config
        return {**base, **place_mounts(base, self.mounts), **place_devices(base, self.devices or {})}

    def against(self, live: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
        """The desired config keyed against the live one (keys kept, new ones lowest free)."""
        placed = place_devices(live, self.devices, current) if self.devices is not None else {}
        return {**self.config, **place_mounts(live, self.mounts), **placed}


def ensure(
    client: PveClient,
    node: str,
    desired: dict[str, Any],
    check_mode: bool = False,
    allow_restart: bool = False,
    allow_recreate: bool = False,
    attempts: int = 5,
    adopt: bool = False,
    mounts: Mapping[str, str] | None = None,
    devices: Mapping[str, str] | None = None,
    host_nodes: Collection[str] | None = None,
) -> Result:
    """Converge container ``desired['vmid']`` to ``desired`` and leave it running.

    ``mounts``: bind mount points by target path; ``devices``: devN values by host path
    (``wanted_devices``). Their keys are chosen against the live config, so a key never moves;
    ``devices`` None leaves the container's devN alone. ``host_nodes``: the character device nodes
    the Proxmox host has; with it, a devN the host lost is refused before any write. Retryable
    failures (connection, transient answers: gpunode.stages.container.causes) re-run the whole decision
    from a fresh read, which is what makes a retried write safe: nothing is sent twice on the
    strength of a stale view. A refusal fails at once.
    """
    # A YAML true in the module's free config: Proxmox's booleans are 0 and 1 only (pve-common
    # src/PVE/JSONSchema.pm check_type, line 1251), and "True" would never equal the live "1".
    desired = {key: int(value) if isinstance(value, bool) else value for key, value in desired.items()}
    vmid = int(desired["vmid"])
    given = sorted((key for key in desired if DEV_KEY.match(key)), key=_key_number)
    if given:
        raise PveError(f"container {vmid}: the config gives {', '.join(given)}: devN keys are placed by device path "
                       f"(devices), never given; nothing was changed")
    if client.conn.method == "token" and (mounts or devices):
        raise PveError(TOKEN_REFUSED, 403)
    wanted = Wanted(dict(desired), dict(mounts or {}), None if devices is None else dict(devices),
                    None if host_nodes is None else frozenset(host_nodes))
    result = Result(vmid=vmid)
    for attempt in range(attempts):
        try:
            _converge(Converger(client, node, vmid), wanted, result, check_mode, allow_restart, allow_recreate, adopt)
            break
        except (TaskFailed, NotOwned, PveUnreachable):
            raise  # the client already retried the connection; a refusal is final
        except PveError as exc:
            if not exc.retryable or attempt == attempts - 1:
                raise
            result.actions.append(f"retrying after: {exc}")
            client.sleep(client.conn.backoff_s * (2 ** attempt))
    result.requests = dict(client.counts)
    return result


def _create_params(desired: dict[str, Any]) -> dict[str, Any]:
    params = {key: value for key, value in desired.items() if value is not None}
    params["start"] = 0
    return params


def _unlocked_status(ct: Converger, result: Result) -> dict[str, Any]:
    """The container's status once no create of an earlier run holds it; any other lock refuses."""
    status = ct.status()
    lock = status.get("lock")
    if lock == "create":
        # An earlier run was interrupted while Proxmox created the container: its worker goes on
        # without us, so wait for it and carry on from what it made.
        upid = ct.active_create_task()
        if upid is None:
            raise PveError(f"container {ct.vmid} is locked by a create whose task is gone (the node restarted "
                           f"mid-create?): on the host run `pct unlock {ct.vmid} && pct destroy {ct.vmid}`, "
                           f"then re-run", 423)
        result.actions.append(f"waiting for the create of container {ct.vmid} that an earlier run started")
        ct.client.wait_task(upid)
        status = ct.status()
        lock = status.get("lock")
    if lock:
        raise PveError(f"container {ct.vmid} is locked ({lock}): wait for the {lock} to finish, "
                       f"or clear a stale lock with `pct unlock {ct.vmid}` on the host", 423)
    return status


def _refuse_lost(ct: Converger, current: Mapping[str, Any], wanted: Wanted, changes: list[Change],
                 result: Result) -> None:
    """A running container with a devN whose node the host lost: Proxmox stats every devN of the
    config on each update (pve-container src/PVE/API2/LXC/Config.pm line 264 -> src/PVE/LXC.pm
    update_lxc_config, line 777 -> src/PVE/LXC/Tools.pm get_device_mode_and_rdev), a pending delete
    included, so any write would fail with 'Device ... does not exist'."""
    if wanted.host_nodes is None:
        return
    lost = lost_nodes(current, wanted.host_nodes)
    if not lost:
        return
    what = ", ".join(f"{key} ({path})" for key, path in lost.items())
    if changes:
        raise PveError(f"container {ct.vmid} runs with {what}, which the Proxmox host lacks: Proxmox checks every devN "
                       f"of a running container on each config update, so this one would fail ('Device ... does not "
                       f"exist'); nothing was changed. Fix: {HOST_STAGE_FIX}; or, if that device is gone for good, "
                       f"stop the container (`pct stop {ct.vmid}`) and re-run: a stopped container drops it at once")
    result.warnings.append(f"container {ct.vmid} runs with {what}, which the Proxmox host lacks: its next start "
                           f"fails until the node is back ({HOST_STAGE_FIX})")


def _converge(ct: Converger, wanted: Wanted, result: Result, check_mode: bool,
              allow_restart: bool, allow_recreate: bool, adopt: bool = False) -> None:
    version = ct.client.version()
    result.pve_version = str(version)
    if not ct.exists():
        _create(ct, wanted.fresh(), result, check_mode)
        if check_mode:
            return
    status = _unlocked_status(ct, result)
    running = status.get("status") == "running"
    live = ct.config()
    # Proxmox's "new" (hot-pluggable) is against the config the container runs with, not the
    # pending view GET config gives by default.
    current = ct.config(current=True) if running else live
    desired = wanted.against(live, current)
    result.before = {k: str(v) for k, v in live.items() if k in desired or DEV_KEY.match(k)}
    changes = compare(live, desired)
    blocked = [c for c in changes if c.how == "recreate"]
    foreign = not owned(live)
    if foreign and not adopt:
        raise NotOwned(foreign_message(ct.vmid, live, status))
    if foreign and blocked and allow_recreate:
        raise NotOwned(f"container {ct.vmid} (hostname {live.get('hostname', '?')}) was not made by gpunode: "
                       f"--recreate-container never destroys it, even with --adopt; nothing was changed. Adopt it "
                       f"first (--adopt without --recreate-container), then re-create it in a later run")
    if running and not (blocked and allow_recreate):
        _refuse_lost(ct, current, wanted, changes, result)
    if foreign:
        result.adopted = True
        result.actions.append(f"{'would adopt' if check_mode else 'adopting'} container {ct.vmid} "
                              f"(hostname {live.get('hostname', '?')}, --adopt): it gets the '{OWNER_TAG}' tag")
    if blocked and not allow_recreate:
        what = "; ".join(f"{c.key}: {c.before} -> {c.after}" for c in blocked)
        if foreign and not check_mode:
            # Adopted all the same (mark and settable keys), so that a later run may re-create it.
            _apply(ct, live, [c for c in changes if c.how != "recreate"])
            result.changed = True
        raise PveError(f"container {ct.vmid}: {what} can only change by re-creating the container, which destroys "
                       f"its disk: re-run with --recreate-container to allow it"
                       + (" (it is adopted now: marked as gpunode's)" if foreign and not check_mode else ""), 409)
    if blocked:
        result.changes.extend(changes)
        result.actions.append(f"re-creating container {ct.vmid} (--recreate-container): {', '.join(c.key for c in blocked)}")
        result.changed = True
        if check_mode:
            return
        if running:
            ct.stop()
        ct.destroy()
        desired = wanted.fresh()
        _create(ct, desired, result, check_mode)
        live = current = ct.config()
        changes = compare(live, desired)
        status = ct.status()
        running = status.get("status") == "running"
    result.changes.extend(c for c in changes if c not in result.changes)
    if changes:
        result.changed = True
        result.actions.append(("would change: " if check_mode else "changing: ") + ", ".join(c.key for c in changes))
        if not check_mode:
            _apply(ct, live, changes)
    _settle_pending(ct, version, changes, current, running, result, check_mode, allow_restart)
    if not running:
        result.actions.append(f"{'would start' if check_mode else 'starting'} container {ct.vmid}")
        result.changed = True
        if not check_mode:
            ct.start()
            ct.wait_running()
            result.started = True
    if not check_mode:
        result.after = {k: str(v) for k, v in ct.config().items() if k in desired or DEV_KEY.match(k)}
    else:
        result.after = {**result.before, **{c.key: str(c.after) for c in changes if c.after is not None}}
        for c in changes:
            if c.after is None:
                result.after.pop(c.key, None)


def _settle_pending(ct: Converger, version: PveVersion, changes: list[Change], current: Mapping[str, Any],
                    running: bool, result: Result, check_mode: bool, allow_restart: bool) -> None:
    """What waits for a restart: read back after a write, predicted by ``hotplug`` in check mode
    (together with what earlier runs left pending); restarted only when allowed."""
    if check_mode:
        predicted = {c.key: hotplug(version, c, running, current) for c in changes}
        waiting = [key for key, how in predicted.items() if how == "restart"]
        undone = {key for key, how in predicted.items() if how == "live"}  # e.g. a delete set back
        pending = sorted(set(waiting) | (set(ct.pending()) - undone)) if running else []
        result.applies = predicted
    else:
        pending = ct.pending() if running else []
        result.applies = {c.key: "restart" if c.key in pending else "live" for c in changes}
    if pending and running:
        if allow_restart and not check_mode:
            result.actions.append(f"restarting container {ct.vmid} to apply: {', '.join(pending)}")
            ct.stop()
            ct.start()
            ct.wait_running()
            result.restarted = True
            pending = ct.pending()
        else:
            result.restart_needed = True
            result.warnings.append(
                f"container {ct.vmid} must restart to apply {', '.join(pending)} ({hotplug_rule(version)}): "
                f"re-run with --restart-container, or `pct reboot {ct.vmid}`")
    result.pending = pending


def _create(ct: Converger, desired: dict[str, Any], result: Result, check_mode: bool) -> None:
    result.changed = result.created = True
    result.actions.append(f"{'would create' if check_mode else 'creating'} container {ct.vmid}")
    result.after = {k: str(v) for k, v in desired.items() if k not in CREATE_ONLY}
    if check_mode:
        result.changes = [Change(k, None, v, "set") for k, v in result.after.items()]
        return
    try:
        ct.create(_create_params(desired))
    except TaskFailed:
        # Proxmox removes what a failed create made; if anything is left unlocked, remove it too,
        # so the next run does not trip over a half-made container.
        if ct.exists() and not ct.status().get("lock"):
            result.actions.append(f"create failed: removed the partly made container {ct.vmid}")
            ct.destroy()
        raise


def _apply(ct: Converger, live: Mapping[str, Any], changes: list[Change]) -> None:
    sets: dict[str, str] = {}
    deletes: list[str] = []
    for change in changes:
        if change.how == "resize":
            ct._task("PUT", f"{ct.base}/{ct.vmid}/resize", disk="rootfs", size=str(change.after))
        elif change.how == "delete":
            deletes.append(change.key)
        elif change.how == "set" and change.after is not None:
            value = _keep_hwaddr(live, change.key, change.after) if change.key.startswith("net") else change.after
            sets[change.key] = value
    if sets or deletes:
        params: dict[str, Any] = dict(sets)
        if deletes:
            params["delete"] = ",".join(deletes)
        ct._task("PUT", f"{ct.base}/{ct.vmid}/config", **params)


def char_nodes(devices: Mapping[str, Any] | Sequence[str]) -> tuple[list[str], list[str]]:
    """(character device nodes, other files) among the host's NVIDIA paths: nvidia_device_facts'
    ``devices`` map (path -> {char: ...}), or a plain list of paths, each taken as a character
    device. Proxmox passes through only a device node (src/PVE/LXC/Tools.pm get_device_mode_and_rdev)."""
    if isinstance(devices, Mapping):
        char = [path for path, facts in devices.items() if isinstance(facts, Mapping) and facts.get("char") is True]
        return sorted(char), sorted(path for path in devices if path not in char)
    return sorted(str(path) for path in devices), []


def wanted_devices(found: Sequence[str], gpus: str | list[int], mig: bool,
                   control: tuple[str, ...] = CONTROL_NODES, optional: tuple[str, ...] = OPTIONAL_NODES,
                   mode: str = DEV_MODE, not_char: Sequence[str] = ()) -> dict[str, str]:
    """devN values by host path for the NVIDIA nodes the host really has, in the order a new
    container numbers them: the GPUs, the control nodes, the optional ones the host has, MIG's
    capability nodes (gpunode.ground.nvidia).

    ``found`` are the host's character device nodes (discovered, never assumed); ``not_char``
    paths the host has as something else. Raises ValueError naming what the selection needs but
    the host lacks, and the host fix.
    """
    present = set(found)
    odd = set(not_char)

    def missing_text(paths: list[str]) -> str:
        return ", ".join(f"{p} (there, but not a character device)" if p in odd else p for p in paths)

    gpu_paths = sorted((p for p in present if re.fullmatch(r"/dev/nvidia\d+", p)), key=lambda p: int(p[11:]))
    if gpus == "all":
        chosen = gpu_paths
        if not chosen:
            raise ValueError(f"the host has no /dev/nvidiaN device node: is the NVIDIA driver loaded? {HOST_STAGE_FIX}")
    else:
        chosen = [f"/dev/nvidia{minor}" for minor in gpus]
        missing = [p for p in chosen if p not in present]
        if missing:
            raise ValueError(f"selected GPU node(s) {missing_text(missing)} not on the host (it has: "
                             f"{', '.join(gpu_paths) or 'none'}): fix container.gpus, or {HOST_STAGE_FIX}")
    lacking = [p for p in control if p not in present]
    if lacking:
        raise ValueError(f"{missing_text(lacking)} missing on the host: nvidia-uvm nodes appear once something loads "
                         f"the module (nvidia-modprobe -u -c=0); {HOST_STAGE_FIX}")
    paths = chosen + list(control) + [p for p in optional if p in present]
    if mig:
        paths += sorted(p for p in present if p.startswith(f"{CAPS_DIR}/"))
    return {path: f"{path},mode={mode}" for path in paths}
