"""The lab's Proxmox VE stand-in: fakepve, plus the part of pve-container that realizes bind mounts.

fakepve keeps a container's config and run state, but nothing happens to a real container. For
the lab's LXC containers (under --lxcpath) this module does what pve-container does for bind mount
points (``mpN: /host/dir,mp=/path[,ro=1]``):

* a fakepve container is *realized* when it runs and its ``hostname`` names an LXC container under
  --lxcpath (the lab's fakepve container 200 is ``gpunode-lab``);
* the host directory of a bind mount is on the *Proxmox host*, i.e. under --host-rootfs (the
  rootfs of the lab's ``gpunode-lab-host`` container);
* only the live config counts, never pending values: pve-container hot-plugs a *new* mpN into a
  running container at once (LXC/Config.pm vmconfig_hotplug_pending -> apply_pending_mountpoint ->
  LXC.pm mountpoint_hotplug), leaves a changed or deleted one pending until the next start
  ("don't try to hotplug over existing mp"), and mounts every mount point on start. fakepve
  already models which values go live (LxcApi._apply); this module mounts what went live.

A failed hot-plug fails the whole config update the way pve-container does (API2/LXC/Config.pm
raises the per-option errors before write_config): HTTP 400, "Parameter verification failed.",
``mp0: unable to hotplug mp0: directory '/x' does not exist``, and nothing of the update is kept.
A start with a missing directory (pve-container would fail it) only warns on stderr.

Device passthrough (``devN``) as pve-container does it: a new devN on a running container is
hot-plugged (PVE 9; ``--pve-version 8.x`` keeps it pending, as PVE 8 does): a device node with the
host node's type and numbers is made in a passthrough folder and bind-mounted onto a file created
at its path in the container (LXC.pm device_passthrough_hotplug, line 2336); a failure aborts the
whole update like a failed mount point. The lab's containers already carry the fake NVIDIA nodes
from their LXC config (what Proxmox puts there at start): a path that already holds the same
device counts as plugged. What real Proxmox refuses and fakepve does not is refused here too
(gpunode_lab.pverules): device and mount point paths, booleans other than 0/1, a devN whose node
the Proxmox host (--host-container's /dev) lacks, SSH public keys ssh-keygen refuses.

Restarting a container through the API never restarts the LXC container: only its mounts are
realized again. What this process mounted is kept in --state, so a new process (which starts with
no fakepve containers) unmounts what an old one left.

    python -m gpunode_lab.pve GUESTS [fakepve's arguments] --lxcpath DIR --host-rootfs DIR --state FILE
        [--host-container NAME] [--pve-version X.Y.Z]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import fakepve.__main__ as fakepve_cli  # type: ignore[import-untyped]
from fakepve import formats as fakepve_formats  # type: ignore[import-untyped]
from aiohttp import web
from fakepve.lxc import mount_type, parse_mount, split_props  # type: ignore[import-untyped]
from fakepve.model import PveError  # type: ignore[import-untyped]
from fakepve.server import FakePve  # type: ignore[import-untyped]

from gpunode_lab import pverules

__all__ = ["LabPve", "Mount", "Realizer", "main"]

MP_KEY = re.compile(r"mp\d+")
DEV_KEY = re.compile(r"dev\d+")
DEV_HOTPLUG_SINCE = 9  # pve-container 6.0.4 ("implement device hotplug"), first in Proxmox VE 9.0
MOVE_MOUNT_T_EMPTY_PATH = 0x40
# The periodic pass catches what no request hook sees: tasks that finish after their response
# (a time scale above 0) and an LXC container restarted underneath (its mounts died with it).
RECONCILE_EVERY_S = 0.2
# ... but a pass that finds nothing changed in fakepve re-checks the LXC side only this often.
FULL_CHECK_EVERY_S = 2.0
HELPER_TIMEOUT_S = 30.0

# x86_64 syscall numbers and flags of the new mount API (linux/mount.h, linux/fcntl.h, sched.h).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
CLONE_NEWNS = 0x20000
MNT_DETACH = 2


def _warn(message: str) -> None:
    print(f"labpve: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the mounts


@dataclasses.dataclass(frozen=True)
class Mount:
    """One bind mount in an LXC container. Two are the same mount when container, target, source
    and ro agree: which fakepve container and key asked for it is bookkeeping."""

    container: str  # LXC container name
    target: str  # absolute path inside it (mp=)
    source: str  # host directory on this machine: --host-rootfs + volume
    ro: bool
    volume: str = dataclasses.field(compare=False)  # the path as the config names it (on the PVE host)
    vmid: int = dataclasses.field(compare=False)
    key: str = dataclasses.field(compare=False)
    # The source directory's identity when it was mounted (0, 0 while only asked for): a mount
    # stays on the directory it was made from, even if the path is replaced later.
    inode: tuple[int, int] = dataclasses.field(default=(0, 0), compare=False)

    @property
    def where(self) -> str:
        return f"{self.container}:{self.target}"


MountKey = tuple[str, str]  # (container, target)
Errors = dict[tuple[int, str], str]  # (vmid, mpN) -> why it could not be mounted


def device_path(value: str) -> str:
    """The host path of a devN value (``[path=]/dev/...[,mode=...]``)."""
    first, props = split_props(value)
    return str(props.get("path") or first or "")


# fakepve 0.5.0 checks no device or mount point path: pve-container's own two formats.
fakepve_formats.NAMED.setdefault("pve-lxc-dev-string", pverules.dev_path_problem)
fakepve_formats.NAMED.setdefault("pve-lxc-mp-string", pverules.mp_path_problem)


def _flag(value: str | None) -> bool:
    return str(value or "").lower() in ("1", "yes", "on", "true")


def _mountinfo(pid: int) -> dict[str, list[str]]:
    """Mount point -> per-mount options of the topmost mount there, in pid's mount namespace."""
    table: dict[str, list[str]] = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        # mountinfo escapes space, tab, newline and backslash as \ooo.
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        table[point] = fields[5].split(",")  # later lines are mounted on top of earlier ones
    return table


def _rows(mounts: dict[MountKey, Mount]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(m) for _, m in sorted(mounts.items())]


class Realizer:
    """Brings the bind mounts of the lab's LXC containers to what fakepve's live configs ask for."""

    def __init__(self, lxcpath: Path, host_rootfs: Path, state: Path,
                 helper: Callable[[list[str]], None] | None = None, host_container: str | None = None) -> None:
        self.lxcpath = lxcpath
        self.host_rootfs = host_rootfs
        self.host_container = host_container
        self.state = state
        self.helper = helper or _run_helper
        self.mounts: dict[MountKey, Mount] = self._load()
        # Set once this process serves the API: the port is taken by one process at a time, so
        # only then is the state file this process's to act on.
        self.serving = False
        self._warned: dict[MountKey, str] = {}
        self._last_desired: dict[MountKey, Mount] | None = None
        self._last_full = 0.0

    # -- state file -------------------------------------------------------------------------
    def _load(self) -> dict[MountKey, Mount]:
        try:
            rows = json.loads(self.state.read_text())["mounts"]
            found = [Mount(**dict(row, inode=tuple(row["inode"]))) for row in rows]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _warn(f"ignoring unreadable state file {self.state}: {exc}")
            return {}
        return {(m.container, m.target): m for m in found}

    def _save(self) -> None:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state.with_name(self.state.name + ".tmp")
        tmp.write_text(json.dumps({"mounts": _rows(self.mounts)}, indent=1) + "\n")
        os.replace(tmp, self.state)  # a crash leaves the old file or the new one, never half

    # -- what fakepve asks for ---------------------------------------------------------------
    def desired(self, cts: Iterable[Any]) -> tuple[dict[MountKey, Mount], Errors]:
        """The bind mounts of the live configs of running, realized fakepve containers; and the
        entries that cannot be mounted whatever happens (a path with '..', a clash)."""
        want: dict[MountKey, Mount] = {}
        errors: Errors = {}
        for ct in sorted(cts, key=lambda c: int(c.vmid)):
            name = ct.config.get("hostname")
            if ct.status != "running" or not name or not (self.lxcpath / name / "config").is_file():
                continue
            for key in sorted((k for k in ct.config if MP_KEY.fullmatch(k)), key=lambda k: int(k[2:])):
                mp = parse_mount(ct.config[key])
                volume, target = str(mp.get("volume", "")), str(mp.get("mp", ""))
                if mount_type(volume) != "bind" or not target:
                    continue  # storage volumes and devices are not the lab's business
                if ".." in Path(volume).parts or ".." in Path(target).parts or not target.startswith("/"):
                    errors[(ct.vmid, key)] = f"unsafe path in '{ct.config[key]}'"
                    continue
                m = Mount(name, os.path.normpath(target), os.path.normpath(f"{self.host_rootfs}/{volume}"),
                          _flag(mp.get("ro")), volume, int(ct.vmid), key)
                if (name, m.target) in want:
                    other = want[(name, m.target)]
                    errors[(ct.vmid, key)] = f"{m.where} is already {other.key} of CT {other.vmid}"
                    continue
                want[(name, m.target)] = m
        return want, errors

    # -- the LXC side ------------------------------------------------------------------------
    def _init_pid(self, name: str) -> int | None:
        """The LXC container's init pid, or None when it is not running."""
        try:
            out = subprocess.run(["lxc-info", "-P", str(self.lxcpath), "-n", name, "-pH"], check=False,
                                 capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            _warn(f"lxc-info on {name}: {exc}")
            return None
        return int(out) if out.isdigit() else None

    @staticmethod
    def _present(pid: int, table: dict[str, list[str]], m: Mount) -> bool:
        """True if m is what is mounted on its target: the topmost mount there has m's read-only
        flag and shows the directory that was mounted (same device and inode)."""
        options = table.get(m.target)
        if options is None or ("ro" in options) != m.ro:
            return False
        try:
            inside = os.stat(f"/proc/{pid}/root{m.target}")  # resolved in the container's mounts
        except OSError:
            return False
        return (inside.st_dev, inside.st_ino) == m.inode

    # -- devices -----------------------------------------------------------------------------
    def host_root(self) -> str:
        """The Proxmox host's / as this machine reaches it: the host container's root (its /dev
        is its own, not under its rootfs), else --host-rootfs."""
        pid = self._init_pid(self.host_container) if self.host_container else None
        return f"/proc/{pid}/root" if pid is not None else str(self.host_rootfs)

    def realized_container(self, ct: Any) -> str | None:
        """The LXC container a running fakepve container stands for, if any."""
        name = ct.config.get("hostname")
        if ct.status != "running" or not name or not (self.lxcpath / name / "config").is_file():
            return None
        return str(name)

    def passthrough(self, vmid: Any) -> Path:
        """Where the nodes hot-plugged into container ``vmid`` are made (LXC.pm line 2368:
        /var/lib/lxc/VMID/passthrough)."""
        return self.state.parent / "passthrough" / str(vmid)

    def plug(self, ct: Any, value: str) -> str | None:
        """Hot-plug one devN value into the LXC container of ``ct``; why it failed, or None."""
        name = self.realized_container(ct)
        if name is None:
            return None  # not one of the lab's LXC containers: nothing happens to a real one
        path, mode = device_path(value), int(split_props(value)[1].get("mode") or "0", 8)
        pid = self._init_pid(name)
        if pid is None:
            return f"failed to open pidfd of container {ct.vmid}'s init process"
        try:
            host = os.stat(f"{self.host_root()}{path}")
        except OSError as exc:
            return f"Device {path} does not exist" if isinstance(exc, FileNotFoundError) else str(exc)
        with contextlib.suppress(OSError):
            inside = os.stat(f"/proc/{pid}/root{path}")
            if stat.S_ISCHR(inside.st_mode) and inside.st_rdev == host.st_rdev:
                return None  # already there: the lab's LXC config hands it in
        # create_passthrough_device_node (LXC.pm line 1897): a node of our own, with the devN's mode.
        # Its folder is emptied at each start (pve-container mounts a fresh tmpfs there in its
        # prestart hook), so a second plug of one path in one run fails as it does there.
        node = self.passthrough(ct.vmid) / path.lstrip("/")
        node.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(node, (host.st_mode & (stat.S_IFCHR | stat.S_IFBLK)) | (mode or 0o600), host.st_rdev)
        except OSError as exc:
            return f"failed to mknod {node}: {exc.strerror}"
        if mode:
            os.chmod(node, mode)
        try:
            self.helper(["plug", str(pid), str(node), path])
        except OSError as exc:
            return str(exc)
        _warn(f"plugged {path} into {name} for CT {ct.vmid}")
        return None

    # -- reconcile ---------------------------------------------------------------------------
    def reconcile(self, cts: Iterable[Any], lazy: bool = False) -> Errors:
        """Mount what is asked for and missing (or mounted from another source), unmount what no
        longer is. lazy (the periodic pass): do nothing when fakepve asks for what it asked for
        last time and the LXC side was checked less than FULL_CHECK_EVERY_S ago."""
        want, errors = self.desired(cts)
        now = time.monotonic()
        if lazy and want == self._last_desired and now - self._last_full < FULL_CHECK_EVERY_S:
            return {}
        self._last_desired, self._last_full = want, now
        errors.update(self._apply(want))
        return errors

    def release_all(self) -> None:
        """Unmount everything this realizer mounted (fakepve's containers end with its process)."""
        self._apply({})

    def _apply(self, want: dict[MountKey, Mount]) -> Errors:
        # A SIGTERM in the middle would leave a mount that the state file does not know of.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            return self._apply_unblocked(want)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _apply_unblocked(self, want: dict[MountKey, Mount]) -> Errors:
        errors: Errors = {}
        before = dict(self.mounts)
        for name in sorted({k[0] for k in want} | {k[0] for k in self.mounts}):
            pid = self._init_pid(name)
            if pid is None:
                # Stopped: its mount namespace, and every mount in it, is gone. Mounted on its next
                # start by a later pass.
                self.mounts = {k: m for k, m in self.mounts.items() if m.container != name}
                continue
            table = _mountinfo(pid)
            for k, m in sorted(self.mounts.items()):
                if m.container != name:
                    continue
                if not self._present(pid, table, m):
                    del self.mounts[k]  # gone from under us (unmounted by hand, container restarted)
                elif want.get(k) != m:
                    try:
                        self.helper(["umount", str(pid), m.target])
                    except OSError as exc:
                        self._note(k, f"cannot unmount {m.where}: {exc}")
                        continue
                    del self.mounts[k]
                    _warn(f"unmounted {m.where} ({m.source})")
            for k, m in sorted(want.items()):
                if m.container != name:
                    continue
                if k in self.mounts:
                    # The same mount; keep who asks for it now.
                    self.mounts[k] = dataclasses.replace(m, inode=self.mounts[k].inode)
                    continue
                if not os.path.isdir(m.source):
                    # pve-container's own words (LXC.pm mountpoint_mount), naming the PVE host's path.
                    errors[(m.vmid, m.key)] = f"directory '{m.volume}' does not exist"
                    self._note(k, f"not mounting {m.where} for CT {m.vmid} {m.key}: directory {m.source} "
                                  "does not exist")
                    continue
                try:
                    st = os.stat(m.source)
                    self.helper(["mount", str(pid), m.source, m.target, "1" if m.ro else "0"])
                except OSError as exc:
                    errors[(m.vmid, m.key)] = str(exc)
                    self._note(k, f"cannot mount {m.source} on {m.where} for CT {m.vmid} {m.key}: {exc}")
                    continue
                self.mounts[k] = dataclasses.replace(m, inode=(st.st_dev, st.st_ino))
                self._warned.pop(k, None)
                _warn(f"mounted {m.source} on {m.where}{' read-only' if m.ro else ''} for CT {m.vmid} {m.key}")
        self._warned = {k: v for k, v in self._warned.items() if k in want}
        if _rows(self.mounts) != _rows(before):
            self._save()
        return errors

    def _note(self, key: MountKey, message: str) -> None:
        """Warn once per problem: the periodic pass retries every few seconds."""
        if self._warned.get(key) != message:
            self._warned[key] = message
            _warn(message)


# ----------------------------------------------------------------------------- the helper
# setns() into a mount namespace fails in a multi-threaded process, so each mount or unmount runs
# in a short-lived single-threaded child: the way pve-container (mountpoint_hotplug, in a fork) and
# systemd-machined (bind-user / machinectl bind) move a mount into a running container.


def _run_helper(args: list[str]) -> None:
    code = "import sys, gpunode_lab.pve as m; sys.exit(m.ns_helper(sys.argv[1:]))"
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True,
                              timeout=HELPER_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise OSError(f"{args[0]} helper timed out after {HELPER_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise OSError(lines[-1] if lines else f"{args[0]} helper exited with status {proc.returncode}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _enter_mount_ns(libc: ctypes.CDLL, pid: int) -> None:
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, CLONE_NEWNS), f"setns into the mount namespace of {pid}")
    finally:
        os.close(fd)
    os.chdir("/")  # setns set root and cwd to the container's root; paths below resolve in it


def _mount(pid: int, source: str, target: str, ro: bool) -> None:
    libc = _libc()
    c = ctypes.c_long
    # A detached copy of the source tree, taken in this (the host's) mount namespace.
    tree = _check(libc.syscall(c(SYS_OPEN_TREE), c(AT_FDCWD), source.encode(),
                               c(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)), f"open_tree {source}")
    if ro:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        _check(libc.syscall(c(SYS_MOUNT_SETATTR), c(tree), b"", c(AT_EMPTY_PATH | AT_RECURSIVE),
                            ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr ro")
    _enter_mount_ns(libc, pid)
    os.makedirs(target, mode=0o755, exist_ok=True)  # pve-container creates the mount point too
    _check(libc.syscall(c(SYS_MOVE_MOUNT), c(tree), b"", c(AT_FDCWD), target.encode(),
                        c(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount onto {target}")


def _plug(pid: int, source: str, target: str) -> None:
    """device_passthrough_hotplug's steps: a detached copy of our node, a regular file created at
    the path through the container's root, then the node moved onto that file inside its mounts."""
    libc = _libc()
    c = ctypes.c_long
    tree = _check(libc.syscall(c(SYS_OPEN_TREE), c(AT_FDCWD), source.encode(), c(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)),
                  "open_tree() on passthrough device node failed")
    where = f"/proc/{pid}/root{target}"
    try:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        dest = os.open(where, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise OSError(f"failed to create '{where}': {exc.strerror}") from None  # pve-container's words
    _enter_mount_ns(libc, pid)
    _check(libc.syscall(c(SYS_MOVE_MOUNT), c(tree), b"", c(dest), b"",
                        c(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)), "move_mount failed")


def _umount(pid: int, target: str) -> None:
    libc = _libc()
    _enter_mount_ns(libc, pid)
    _check(libc.umount2(target.encode(), MNT_DETACH), f"umount2 {target}")


def ns_helper(argv: list[str]) -> int:
    """The child's entry: ``mount PID SOURCE TARGET 0|1``, ``umount PID TARGET`` or ``plug PID NODE PATH``."""
    try:
        if argv[:1] == ["mount"] and len(argv) == 5:
            _mount(int(argv[1]), argv[2], argv[3], argv[4] == "1")
        elif argv[:1] == ["umount"] and len(argv) == 3:
            _umount(int(argv[1]), argv[2])
        elif argv[:1] == ["plug"] and len(argv) == 4:
            _plug(int(argv[1]), argv[2], argv[3])
        else:
            print(f"usage: mount PID SOURCE TARGET 0|1 | umount PID TARGET | plug PID NODE PATH (got {argv})",
                  file=sys.stderr)
            return 2
    except (OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------- fakepve


class LabPve(FakePve):  # type: ignore[misc]  # fakepve has no type information
    """FakePve that realizes bind mount points and device hot-plug on the lab's LXC containers after
    every change, and refuses what pve-container refuses (gpunode_lab.pverules)."""

    def __init__(self, *args: Any, realizer: Realizer, pve_version: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.realizer = realizer
        self._ticker: asyncio.Task[None] | None = None
        if pve_version:
            self.version = pve_version
            self.release_version = ".".join(pve_version.split(".")[:2])

    @property
    def dev_hotplug(self) -> bool:
        return int(str(self.version).split(".")[0]) >= DEV_HOTPLUG_SINCE

    def _sync(self, lazy: bool = False) -> Errors:
        try:
            return self.realizer.reconcile(self.cts, lazy=lazy)
        except Exception as exc:  # noqa: BLE001 - the API must keep answering; the log says why
            _warn(f"reconcile failed: {type(exc).__name__}: {exc}")
            return {}

    async def start(self, certfile: str, keyfile: str) -> None:
        await super().start(certfile, keyfile)
        self.realizer.serving = True
        self._sync()  # no containers yet: drops what an earlier process left mounted
        self._ticker = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_EVERY_S)
            self._sync(lazy=True)

    def _build_app(self) -> web.Application:
        app: web.Application = super()._build_app()
        app.middlewares.append(self._realize_after)  # innermost: right around the route handler
        return app

    @web.middleware
    async def _realize_after(self, request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """After any write (stop, shutdown, destroy, ...), before its response: the realized
        mounts follow. With time_scale 0 a task has finished by then."""
        try:
            return await handler(request)
        finally:
            if request.method != "GET":
                self._sync()

    async def answer(self, request: web.Request, match: Any, params: dict[str, Any], user: str,
                     call: Any = None) -> Any:
        """fakepve's schema check, with PVE's strict top-level booleans first (pverules)."""
        info = match.methods.get(request.method) if match is not None else None
        if info is not None:
            errors = pverules.boolean_problems(info.get("parameters"), params,
                                               request.content_type == "application/json")
            if errors:
                raise PveError(400, "Parameter verification failed.", errors)
        return await super().answer(request, match, params, user, call)

    def _devices_problem(self, values: dict[str, Any]) -> str | None:
        """update_pct_config's check of each devN it sets (pve-container src/PVE/LXC/Config.pm
        lines 1376-1383, also on create: API2/LXC.pm line 413), on the lab's Proxmox host."""
        root = Path(self.realizer.host_root())
        for key in sorted((k for k in values if DEV_KEY.fullmatch(k)), key=lambda k: int(k[3:])):
            why = pverules.device_problem(root, device_path(str(values[key])))
            if why:
                return why
        return None

    async def _lxc_create(self, user: str, v: dict[str, Any]) -> Any:
        keys = v.get("ssh-public-keys")
        # API2/LXC.pm line 290: the keys are validated before anything else of the create.
        why = pverules.ssh_keys_problem(str(keys)) if keys is not None else None
        why = why or self._devices_problem(v)
        if why:
            raise PveError(500, why)
        return await super()._lxc_create(user, v)

    def _apply(self, ct: Any, selection: Any = None, running: bool = False) -> None:
        """PVE 8 hot-plugs no devN: a new one waits for the start like a changed one."""
        held: dict[str, Any] = {}
        if running and not self.dev_hotplug:
            held = {k: v for k, v in ct.pending.items() if DEV_KEY.fullmatch(k) and v is not None and k not in ct.config}
            for key in held:
                del ct.pending[key]
        try:
            super()._apply(ct, selection, running)
        finally:
            ct.pending.update(held)

    async def _update_config(self, ct: Any, user: str, values: dict[str, Any], deletes: list[str],
                             reverts: list[str]) -> None:
        why = self._devices_problem(values)
        if why:
            raise PveError(500, why)
        config, pending = dict(ct.config), dict(ct.pending)
        await super()._update_config(ct, user, values, deletes, reverts)
        plugged = {k for k in ct.config if MP_KEY.fullmatch(k) and k not in config}
        failed = {key: msg for (vmid, key), msg in self._sync().items() if vmid == ct.vmid and key in plugged}
        for key in sorted((k for k in ct.config if DEV_KEY.fullmatch(k) and k not in config), key=lambda k: int(k[3:])):
            problem = self.realizer.plug(ct, str(ct.config[key]))
            if problem:
                failed[key] = problem
        if failed:
            # API2/LXC/Config.pm: "don't write to config if we get any errors", then
            # raise_param_exc with vmconfig_hotplug_pending's "unable to hotplug mpN: ...".
            ct.config, ct.pending = config, pending
            self._sync()
            raise PveError(400, "Parameter verification failed.",
                           {key: f"unable to hotplug {key}: {msg}" for key, msg in sorted(failed.items())})
        # Written; then update_lxc_config (API2/LXC/Config.pm line 264 -> LXC.pm line 777) stats
        # every devN of the config as it runs now: a node the host lost fails every update, after
        # the write.
        why = self._devices_problem({k: v for k, v in ct.config.items() if DEV_KEY.fullmatch(k)})
        if why:
            raise PveError(500, why)

    async def _start_steps(self, ct: Any, user: str, skiplock: bool = False) -> None:
        shutil.rmtree(self.realizer.passthrough(ct.vmid), ignore_errors=True)
        await super()._start_steps(ct, user, skiplock)
        self._sync()  # on start pve-container mounts every mount point of the config


# ----------------------------------------------------------------------------- launcher


def main(argv: list[str] | None = None) -> None:
    """``python -m gpunode_lab.pve``: fakepve's command line (python -m fakepve --help), plus where the
    lab's LXC containers and the PVE host's root are and where to keep what was mounted."""
    argv = sys.argv[1:] if argv is None else argv
    # No abbreviations: fakepve's own --host would be read as an abbreviation of --host-rootfs.
    parser = argparse.ArgumentParser(prog="python -m gpunode_lab.pve", add_help=False, allow_abbrev=False,
                                     description=__doc__.splitlines()[0],
                                     epilog="The other arguments are fakepve's: python -m fakepve --help.")
    parser.add_argument("--lxcpath", type=Path, required=True, help="lxcpath of the LXC containers to realize")
    parser.add_argument("--host-rootfs", type=Path, required=True,
                        help="the Proxmox host's / on this machine: bind mount sources are under it")
    parser.add_argument("--state", type=Path, required=True, help="JSON file of the mounts this process made")
    parser.add_argument("--host-container", help="LXC container that plays the Proxmox host: devN nodes are its /dev's")
    parser.add_argument("--pve-version", help="the Proxmox VE version to report and follow (default fakepve's, 9.x)")
    if {"-h", "--help"} & set(argv):
        parser.print_help()
        print()
        sys.argv = ["fakepve", "--help"]
        fakepve_cli.main()
        return
    ours, rest = parser.parse_known_args(argv)
    realizer = Realizer(ours.lxcpath, ours.host_rootfs, ours.state, host_container=ours.host_container)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    # fakepve's serve() builds its server through this module-level name: swapping it in keeps
    # fakepve's own command line (guests file, password, TLS, time scale) exactly as it is.
    fakepve_cli.FakePve = functools.partial(LabPve, realizer=realizer, pve_version=ours.pve_version)
    sys.argv = ["fakepve", *rest]
    try:
        fakepve_cli.main()
    finally:
        if realizer.serving:
            realizer.release_all()  # fakepve's containers end with this process; so do their mounts


if __name__ == "__main__":
    main()
