"""Converge one LXC container to its desired Proxmox config: create, update, start; never destroy
unless asked. Pure logic over PveClient, so check mode and every fault path are testable against
fakepve without Ansible.

Ownership: every container gpunode creates carries the ``gpunode`` tag and a description line
naming the host file's host (both kept and shown by Proxmox). An existing container without the
tag is someone else's: nothing is written to it unless the operator adopts it (``adopt``), and it
is never destroyed, adopted or not (adopt first, re-create in a later run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunode.nvidia import CAPS_DIR, CONTROL_NODES, DEV_MODE, MOUNT_POINT, OPTIONAL_NODES
from gpunode.container.client import PveClient, PveError, PveUnreachable, TaskFailed

DEV_KEY = re.compile(r"^dev\d+$")
MP_KEY = re.compile(r"^mp\d+$")
MAX_MP = 256  # mp0..mp255 (pve-container's MAX_MOUNT_POINTS)
# Written only at creation (Proxmox keeps no record of them in the config).
CREATE_ONLY = ("ostemplate", "ssh-public-keys", "vmid")
# Can only change by re-creating the container.
IMMUTABLE = ("unprivileged",)
TOKEN_REFUSED = (
    "devN device passthrough, bind mount points (and features on a privileged container) are root@pam only, "
    "and an API token "
    "is refused even for root (API tokens are always a subset of their user): use auth.method password "
    "(a root@pam ticket) or auth.method local (pvesh on the Proxmox host)"
)
OWNER_TAG = "gpunode"
MARK_PREFIX = "gpunode:"  # the description line gpunode writes starts with this
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


def mark_line(host: str) -> str:
    """The description line of a container gpunode made for ``host``."""
    return f"{MARK_PREFIX} made for host {host} by gpunode provision; the '{OWNER_TAG}' tag marks it as gpunode's"


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


def _same(key: str, live: str | None, want: str | None) -> bool:
    if live is None or want is None:
        return live == want
    if key == "rootfs":
        a, b = props(live), props(want)
        return a.get("_", "").split(":")[0] == b.get("_", "").split(":")[0] and size_gb(a.get("size", "0")) == size_gb(b.get("size", "0"))
    if key.startswith("net"):
        # Proxmox adds hwaddr and type; only what the host file sets is compared.
        a, b = props(live), props(want)
        return all(a.get(k) == v for k, v in b.items())
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


def compare(live: Mapping[str, Any], desired: Mapping[str, Any]) -> list[Change]:
    """What differs between the live config and the desired one, key by key."""
    changes: list[Change] = []
    for key, value in desired.items():
        if key in CREATE_ONLY:
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
    for key in sorted(live):
        if DEV_KEY.match(key) and key not in desired:
            changes.append(Change(key, str(live[key]), None, "delete"))
    return changes


def bind_mount(source: str, target: str, read_only: bool = True) -> str:
    """An mpN value for a host directory bind-mounted into the container."""
    return f"{source},mp={target}" + (",ro=1" if read_only else "")


def driver_mount(tree: str) -> dict[str, str]:
    """The host's driver tree, read-only at MOUNT_POINT: ``mounts`` for ensure()."""
    return {MOUNT_POINT: bind_mount(tree, MOUNT_POINT)}


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

    def config(self) -> dict[str, Any]:
        data = dict(self.client.get(f"{self.base}/{self.vmid}/config"))
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
) -> Result:
    """Converge container ``desired['vmid']`` to ``desired`` and leave it running.

    ``mounts``: bind mount points by target path (their mpN keys are chosen against the live
    config). Retryable failures (connection, 5xx) re-run the whole decision from a fresh read,
    which is what makes a retried write safe: nothing is sent twice on the strength of a stale view.
    """
    vmid = int(desired["vmid"])
    if client.conn.method == "token" and (mounts or any(DEV_KEY.match(key) for key in desired)):
        raise PveError(TOKEN_REFUSED, 403)
    result = Result(vmid=vmid)
    last: PveError | None = None
    for attempt in range(attempts):
        try:
            _converge(Converger(client, node, vmid), desired, result, check_mode, allow_restart, allow_recreate, adopt,
                      dict(mounts or {}))
            last = None
            break
        except (TaskFailed, NotOwned, PveUnreachable):
            raise  # the client already retried the connection; a refusal is final
        except PveError as exc:
            if not exc.retryable or attempt == attempts - 1:
                raise
            last = exc
            result.actions.append(f"retrying after: {exc}")
            client.sleep(client.conn.backoff_s * (2 ** attempt))
    if last is not None:  # pragma: no cover - loop either breaks or raises
        raise last
    result.requests = dict(client.counts)
    return result


def _create_params(desired: dict[str, Any]) -> dict[str, Any]:
    params = {key: value for key, value in desired.items() if value is not None}
    params["start"] = 0
    return params


def _converge(ct: Converger, desired: dict[str, Any], result: Result, check_mode: bool,
              allow_restart: bool, allow_recreate: bool, adopt: bool = False,
              mounts: dict[str, str] | None = None) -> None:
    if not ct.exists():
        _create(ct, {**desired, **place_mounts({}, mounts or {})}, result, check_mode)
        if check_mode:
            return
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

    live = ct.config()
    desired = {**desired, **place_mounts(live, mounts or {})}
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
        if status.get("status") == "running":
            ct.stop()
        ct.destroy()
        desired = {**{k: v for k, v in desired.items() if not MP_KEY.match(k)}, **place_mounts({}, mounts or {})}
        _create(ct, desired, result, check_mode)
        live = ct.config()
        changes = compare(live, desired)
        status = ct.status()
    result.changes.extend(c for c in changes if c not in result.changes)
    if changes:
        result.changed = True
        result.actions.append(("would change: " if check_mode else "changing: ") + ", ".join(c.key for c in changes))
        if not check_mode:
            _apply(ct, live, changes)
    running = status.get("status") == "running"
    # A new mount point is hot-plugged into a running container; a changed one, like devN and
    # features, waits for the restart (pve-container's vmconfig_hotplug_pending).
    pending = ct.pending() if not check_mode else [
        c.key for c in changes
        if DEV_KEY.match(c.key) or c.key == "features" or (MP_KEY.match(c.key) and c.before is not None)]
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
                f"container {ct.vmid} must restart to apply {', '.join(pending)} (device, mount point and feature "
                f"changes do not apply to a running container): re-run with --restart-container, or `pct reboot {ct.vmid}`")
    result.pending = pending
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


def device_entries(found: list[str], gpus: str | list[int], mig: bool,
                   control: tuple[str, ...] = CONTROL_NODES, optional: tuple[str, ...] = OPTIONAL_NODES,
                   mode: str = DEV_MODE) -> dict[str, str]:
    """devN entries for the NVIDIA nodes the host really has, in a stable order: the GPUs, the
    control nodes, the optional ones the host has, MIG's capability nodes (gpunode.nvidia).

    ``found`` are the host's node paths (discovered, never assumed). Raises ValueError naming what
    the selection needs but the host lacks.
    """
    present = set(found)
    gpu_paths = sorted((p for p in present if re.fullmatch(r"/dev/nvidia\d+", p)), key=lambda p: int(p[11:]))
    if gpus == "all":
        chosen = gpu_paths
        if not chosen:
            raise ValueError("the host has no /dev/nvidiaN node: is the NVIDIA driver loaded? (run the host stage)")
    else:
        chosen = [f"/dev/nvidia{minor}" for minor in gpus]
        missing = [p for p in chosen if p not in present]
        if missing:
            raise ValueError(f"selected GPU node(s) {', '.join(missing)} not on the host (it has: "
                             f"{', '.join(gpu_paths) or 'none'})")
    lacking = [p for p in control if p not in present]
    if lacking:
        raise ValueError(f"{', '.join(lacking)} missing on the host: nvidia-uvm nodes appear once something loads "
                         f"the module (nvidia-modprobe -u -c=0; the host stage sets that up at boot)")
    paths = chosen + list(control) + [p for p in optional if p in present]
    if mig:
        paths += sorted(p for p in present if p.startswith(f"{CAPS_DIR}/"))
    return {f"dev{index}": f"{path},mode={mode}" for index, path in enumerate(paths)}
