"""Local test lab: a stand-in for a Proxmox VE host with NVIDIA GPUs.

`up()` builds, step by step and check-then-change (a second run changes nothing):

* Docker Engine running (dockerd started in the background when `docker info` fails);
* bridge ``lxcbr0`` (10.0.3.1/24) with forwarding and NAT to the outside;
* fake GPU device nodes under ``LAB_DIR/dev`` (char nodes with the NVIDIA majors and no driver
  behind them, so opening one gives ENXIO: proof that the node was handed through);
* a privileged Debian bookworm LXC container ``gpunode-lab`` (10.0.3.10) with systemd, sshd and
  those nodes passed in the way Proxmox's ``devN`` does (cgroup allow rule plus bind mount);
* fakepve, a fake Proxmox VE API, on https://127.0.0.2:8006 with its own CA;
* a second such container, ``gpunode-lab-host`` (10.0.3.11), standing in for the Proxmox host
  itself: same device nodes in its /dev, initramfs-tools and kmod installed, and the files
  recorded on a real H200 machine (tests/fixtures/host/h200/sysroot.tar.gz) unpacked at
  /var/lib/gpunode-lab-facts.

`down()` takes it apart again; `status()` reports what is there. Failures raise `LabError` with
a one-line message naming what failed and how to fix it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpunode import labkernels

__all__ = [
    "LAB_DIR", "LAB_GPU_COUNT", "BRIDGE", "BRIDGE_IP", "BRIDGE_CIDR", "LAB_SUBNET", "CONTAINER_NAME",
    "CONTAINER_IP", "PVE_HOST", "PVE_PORT", "PVE_URL", "PVE_USER", "PVE_NODE", "NVIDIA_MAJOR",
    "LabError", "LabInfo", "up", "down", "status", "cgroup_device_key", "device_nodes", "ssh_command",
    "pve_ticket", "uvm_major", "HOST_CONTAINER_NAME", "HOST_CONTAINER_IP", "LAB_HOST_FACTS_ROOT", "LabContainer",
    "GPU_CONTAINER", "HOST_CONTAINER", "LAB_CONTAINERS",
]

# ----------------------------------------------------------------------------- fixed contract

LAB_DIR = Path("/var/lib/gpunode-lab")
LAB_GPU_COUNT = 2

BRIDGE = "lxcbr0"
BRIDGE_IP = "10.0.3.1"
BRIDGE_CIDR = "10.0.3.1/24"
LAB_SUBNET = "10.0.3.0/24"

CONTAINER_NAME = "gpunode-lab"
CONTAINER_IP = "10.0.3.10"
CONTAINER_CIDR = "10.0.3.10/24"
CONTAINER_HOSTNAME = "gpunode-lab"
DEBIAN_RELEASE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Only used while lxc-create runs (its template always writes a security line and runs apt-get
# update); security.debian.org does not answer here, deb.debian.org serves the same archive.
# The finished container's sources name deb.debian.org bookworm and bookworm-updates only.
TEMPLATE_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
CONTAINER_PACKAGES = ("openssh-server", "python3", "ca-certificates", "sudo")

# The Proxmox host stand-in: the machine the `host` stage configures over ssh and where the
# `container` stage finds the NVIDIA device nodes. It rebuilds the initramfs and reads modprobe
# config, hence initramfs-tools and kmod.
HOST_CONTAINER_NAME = "gpunode-lab-host"
HOST_CONTAINER_IP = "10.0.3.11"
HOST_CONTAINER_HOSTNAME = "gpunode-lab-host"
HOST_CONTAINER_PACKAGES = (*CONTAINER_PACKAGES, "initramfs-tools", "kmod")
# Files recorded on a real H200 machine (/etc, /proc, /sys), unpacked into the host container here.
LAB_HOST_FACTS_ROOT = "/var/lib/gpunode-lab-facts"
HOST_FACTS_TARBALL = "tests/fixtures/host/h200/sysroot.tar.gz"  # relative to gpunode.paths.checkout_root()
HOST_DRIVER_LAYOUT = "tests/fixtures/host/h200/driver"  # likewise: what labdriver lays out
# package -> a file it installs (to find what the template failed to install)
PACKAGE_PROBES = {"openssh-server": "usr/sbin/sshd", "python3": "usr/bin/python3",
                  "ca-certificates": "usr/sbin/update-ca-certificates", "sudo": "usr/bin/sudo",
                  "initramfs-tools": "usr/sbin/update-initramfs", "kmod": "usr/bin/kmod"}
MASKED_UNITS = ("systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
                "systemd-udevd-control.socket", "systemd-udevd-kernel.socket")

# The model folder of inventory/lab/host.yml, made in the node with what the fake server reads
# (a config.json, as transformers would) so that the serve stage can run the stand-in server.
LAB_MODEL_DIR = "/models/GLM-5-NVFP4"
LAB_MODEL_FILES = {"config.json": '{"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}\n',
                   "tokenizer.json": "{}\n"}

NVIDIA_MAJOR = 195
UVM_MAJOR_RANGE = range(234, 255)  # pick the highest char major in 234..254 not in /proc/devices

PVE_HOST = "127.0.0.2"
PVE_PORT = 8006
PVE_URL = f"https://{PVE_HOST}:{PVE_PORT}"
PVE_USER = "root@pam"
# fakepve's command line has no way to name the node: with no guests it has exactly one, "pve1".
PVE_NODE = "pve1"

# Paths, all under LAB_DIR.
DEV_DIR = LAB_DIR / "dev"
UVM_MAJOR_FILE = DEV_DIR / "uvm-major"
SSH_DIR = LAB_DIR / "ssh"
SSH_KEY = SSH_DIR / "id_ed25519"
SSH_PUBKEY = SSH_DIR / "id_ed25519.pub"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
PVE_DIR = LAB_DIR / "pve"
PVE_CA = PVE_DIR / "ca.pem"
PVE_CERT = PVE_DIR / "fakepve.crt"
PVE_KEY = PVE_DIR / "fakepve.key"
PVE_PASSWORD_FILE = PVE_DIR / "password"
PVE_PID_FILE = PVE_DIR / "fakepve.pid"
PVE_LOG = PVE_DIR / "fakepve.log"
PVE_GUESTS = PVE_DIR / "guests.json"
# fakepve runs inside gpunode.labpve, which also realizes bind mount points (mpN) on the lab's LXC
# containers; what it mounted is kept in PVE_MOUNTS.
PVE_MODULE = "gpunode.labpve"
PVE_MOUNTS = PVE_DIR / "mounts.json"
LXC_PATH = LAB_DIR / "lxc"  # lxcpath: pass -P LXC_PATH to lxc-* commands
LXC_CACHE = LAB_DIR / "cache"  # the lxc-debian template's debootstrap cache
DOCKERD_LOG = LAB_DIR / "dockerd.log"
LOCK_FILE = LAB_DIR / ".lock"

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONFIG_BEGIN = "# >>> gpunode-lab: managed by gpunode.lab, rewritten by `gpunode lab up`"
CONFIG_END = "# <<< gpunode-lab"
IPTABLES_COMMENT = "gpunode-lab"
CERT_MAX_AGE_S = 20 * 86400  # fakepve.certs.make_cert certificates last 30 days

# command -> Debian package that provides it
REQUIRED_COMMANDS = {
    "docker": "docker.io", "dockerd": "docker.io", "ip": "iproute2", "iptables": "iptables",
    "lxc-create": "lxc", "lxc-start": "lxc", "lxc-stop": "lxc", "lxc-destroy": "lxc", "lxc-info": "lxc",
    "lxc-attach": "lxc", "lxc-wait": "lxc", "debootstrap": "debootstrap", "rsync": "rsync", "wget": "wget",
    "openssl": "openssl", "debian-distro-info": "distro-info", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "setsid": "util-linux", "chroot": "coreutils",
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LabContainer:
    """One Debian LXC container of the lab, under LXC_PATH on BRIDGE."""

    name: str
    ip: str
    hostname: str
    packages: tuple[str, ...] = CONTAINER_PACKAGES
    facts: bool = False  # unpack the recorded host facts to LAB_HOST_FACTS_ROOT in it

    @property
    def cidr(self) -> str:
        return f"{self.ip}/24"

    @property
    def dir(self) -> Path:
        return LXC_PATH / self.name

    @property
    def config(self) -> Path:
        return self.dir / "config"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"

    @property
    def create_log(self) -> Path:
        return LAB_DIR / ("lxc-create.log" if self.name == CONTAINER_NAME else f"lxc-create.{self.name}.log")

    @property
    def start_log(self) -> Path:
        return LAB_DIR / ("lxc-start.log" if self.name == CONTAINER_NAME else f"lxc-start.{self.name}.log")


GPU_CONTAINER = LabContainer(CONTAINER_NAME, CONTAINER_IP, CONTAINER_HOSTNAME)
HOST_CONTAINER = LabContainer(HOST_CONTAINER_NAME, HOST_CONTAINER_IP, HOST_CONTAINER_HOSTNAME,
                              HOST_CONTAINER_PACKAGES, facts=True)
LAB_CONTAINERS = (GPU_CONTAINER, HOST_CONTAINER)
# The GPU node's paths, as before.
CONTAINER_DIR = GPU_CONTAINER.dir
CONTAINER_CONFIG = GPU_CONTAINER.config
ROOTFS = GPU_CONTAINER.rootfs
LXC_CREATE_LOG = GPU_CONTAINER.create_log
LXC_START_LOG = GPU_CONTAINER.start_log
HOST_ROOTFS = HOST_CONTAINER.rootfs


class LabError(Exception):
    """The lab could not be brought to the asked state; the message is one line: what and the fix."""


@dataclass(frozen=True)
class LabInfo:
    """What `up()` built and how to reach it."""

    lab_dir: str
    container: str
    container_ip: str
    host_container: str  # the Proxmox host stand-in (ssh root@host_ip)
    host_ip: str
    host_facts_root: str  # recorded H200 host files inside host_container
    lxc_path: str
    ssh_user: str
    ssh_key: str
    known_hosts: str
    bridge: str
    gateway: str
    gpu_count: int
    device_nodes: dict[str, str]  # name -> "major:minor", as made under LAB_DIR/dev
    uvm_major: int
    cgroup_key: str
    pve_url: str
    pve_user: str
    pve_password_file: str
    pve_ca: str
    pve_node: str
    changed: list[str] = field(default_factory=list)  # steps that changed something this run
    seconds: float = 0.0


# ----------------------------------------------------------------------------- small helpers


def _noop(_: str) -> None:
    pass


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = 120, what: str = "",
         fix: str = "", env: dict[str, str] | None = None,
         input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure (check) raise LabError naming it."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise LabError(f"{cmd[0]} not found: apt-get install {REQUIRED_COMMANDS.get(cmd[0], cmd[0])}") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{what or ' '.join(cmd)}: timed out after {timeout:.0f} s"
                       + (f"; {fix}" if fix else "")) from None
    if check and proc.returncode != 0:
        detail = _one_line(proc.stderr) or _one_line(proc.stdout) or f"exit status {proc.returncode}"
        raise LabError(f"{what or ' '.join(cmd)} failed: {detail}" + (f"; {fix}" if fix else ""))
    return proc


def _ok(cmd: Sequence[str], timeout: float = 30) -> bool:
    try:
        return subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _write_if_changed(path: Path, content: str | bytes, mode: int | None = None) -> bool:
    """Write content to path unless it is already there (and has the mode); True if changed."""
    data = content.encode() if isinstance(content, str) else content
    changed = False
    if path.is_symlink() or not path.is_file() or path.read_bytes() != data:
        if path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".gpunode-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode if mode is not None else 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
        changed = True
    if mode is not None and stat.S_IMODE(path.stat().st_mode) != mode:
        os.chmod(path, mode)
        changed = True
    return changed


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:])


def _pid_alive(pid: int, needle: str) -> bool:
    """True if process pid runs and its command line contains needle."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and needle in cmdline


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (it makes device nodes, a bridge, iptables rules and an LXC "
                       "container): run it as root, e.g. `sudo gpunode lab up`")


def _require_commands(names: Sequence[str]) -> None:
    missing = sorted({REQUIRED_COMMANDS.get(n, n) for n in names if shutil.which(n) is None})
    if missing:
        cmds = ", ".join(n for n in names if shutil.which(n) is None)
        raise LabError(f"missing command(s) {cmds}: apt-get install {' '.join(missing)}")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(LAB_DIR, 0o755)
    with open(LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"another `gpunode lab` command holds {LOCK_FILE}: wait for it to finish") from None
        yield


def _lxc(ct: LabContainer, cmd: str, *args: str) -> list[str]:
    return [cmd, "-P", str(LXC_PATH), "-n", ct.name, *args]


# ----------------------------------------------------------------------------- docker


def _docker_running() -> bool:
    return _ok(["docker", "info"], timeout=20)


def _ensure_docker(progress: Progress) -> bool:
    if _docker_running():
        progress("docker: engine running")
        return False
    progress(f"docker: starting dockerd (log {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as log:
        proc = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _docker_running():
            progress("docker: engine up")
            return True
        if proc.poll() is not None and not _docker_running():
            raise LabError(f"dockerd exited with status {proc.returncode}: {_tail(DOCKERD_LOG)} "
                           f"(see {DOCKERD_LOG})")
        time.sleep(1)
    raise LabError(f"dockerd did not answer `docker info` within 60 s: see {DOCKERD_LOG}")


# ----------------------------------------------------------------------------- network


def _bridge_state() -> tuple[bool, bool, bool]:
    """(exists, has BRIDGE_CIDR, is up)."""
    proc = _run(["ip", "-j", "addr", "show", "dev", BRIDGE], check=False)
    if proc.returncode != 0:
        return False, False, False
    try:
        info = json.loads(proc.stdout)[0]
    except (ValueError, IndexError):
        return False, False, False
    has_addr = any(a.get("family") == "inet" and f"{a.get('local')}/{a.get('prefixlen')}" == BRIDGE_CIDR
                   for a in info.get("addr_info", []))
    return True, has_addr, "UP" in info.get("flags", [])


def _iptables_rules() -> list[tuple[str, list[str], list[str]]]:
    """(table, check/delete spec, insert spec) for each rule the lab needs."""
    tag = ["-m", "comment", "--comment", IPTABLES_COMMENT]
    masq = ["POSTROUTING", "-s", LAB_SUBNET, "!", "-o", BRIDGE, *tag, "-j", "MASQUERADE"]
    fwd_in = ["-i", BRIDGE, *tag, "-j", "ACCEPT"]
    fwd_out = ["-o", BRIDGE, *tag, "-j", "ACCEPT"]
    return [
        ("nat", masq, ["-A", *masq]),
        ("filter", ["FORWARD", *fwd_in], ["-I", "FORWARD", "1", *fwd_in]),
        ("filter", ["FORWARD", *fwd_out], ["-I", "FORWARD", "1", *fwd_out]),
    ]


def _ensure_network(progress: Progress) -> bool:
    changed = False
    exists, has_addr, is_up = _bridge_state()
    if not exists:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"], what=f"creating bridge {BRIDGE}")
        changed = True
    if not has_addr:
        _run(["ip", "addr", "add", BRIDGE_CIDR, "dev", BRIDGE], what=f"adding {BRIDGE_CIDR} to {BRIDGE}")
        changed = True
    if not is_up:
        _run(["ip", "link", "set", BRIDGE, "up"], what=f"bringing {BRIDGE} up")
        changed = True
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    if fwd.read_text().strip() != "1":
        fwd.write_text("1\n")
        changed = True
    for table, spec, insert in _iptables_rules():
        if not _ok(["iptables", "-w", "-t", table, "-C", *spec]):
            _run(["iptables", "-w", "-t", table, *insert], what=f"iptables -t {table} {' '.join(insert)}",
                 fix="is the iptables comment match available (xt_comment)?")
            changed = True
    progress(f"network: bridge {BRIDGE} {BRIDGE_CIDR}, forwarding and NAT "
             + ("set up" if changed else "in place"))
    return changed


def _remove_network(progress: Progress) -> None:
    for table, spec, _ in _iptables_rules():
        while _ok(["iptables", "-w", "-t", table, "-C", *spec]):
            _run(["iptables", "-w", "-t", table, "-D", *spec], what=f"removing iptables rule {' '.join(spec)}")
    if _bridge_state()[0]:
        _run(["ip", "link", "del", BRIDGE], what=f"deleting bridge {BRIDGE}")
    progress(f"network: iptables rules and bridge {BRIDGE} removed")


# ----------------------------------------------------------------------------- devices


def _char_majors() -> set[int]:
    majors: set[int] = set()
    section = ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
            continue
        parts = line.split()
        if section.startswith("Character") and parts and parts[0].isdigit():
            majors.add(int(parts[0]))
    return majors


def uvm_major() -> int:
    """The char major the lab uses for nvidia-uvm: the recorded one, else the highest free in 234..254."""
    used = _char_majors()
    with contextlib.suppress(OSError, ValueError):
        recorded = int(UVM_MAJOR_FILE.read_text().strip())
        if recorded not in used:
            return recorded
    for major in reversed(UVM_MAJOR_RANGE):
        if major not in used and major != NVIDIA_MAJOR:
            return major
    raise LabError("no free char major in 234..254 for the fake nvidia-uvm node (all listed in /proc/devices)")


def device_nodes(uvm: int | None = None) -> dict[str, tuple[int, int]]:
    """The fake device nodes: name -> (major, minor)."""
    major_uvm = uvm_major() if uvm is None else uvm
    nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(LAB_GPU_COUNT)}
    nodes.update({"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-modeset": (NVIDIA_MAJOR, 254),
                  "nvidia-uvm": (major_uvm, 0), "nvidia-uvm-tools": (major_uvm, 1)})
    return nodes


def _ensure_devices(progress: Progress) -> tuple[bool, int]:
    changed = False
    DEV_DIR.mkdir(parents=True, exist_ok=True)
    uvm = uvm_major()
    changed |= _write_if_changed(UVM_MAJOR_FILE, f"{uvm}\n", 0o644)
    for name, (major, minor) in device_nodes(uvm).items():
        path = DEV_DIR / name
        want = os.makedev(major, minor)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not (stat.S_ISCHR(st.st_mode) and st.st_rdev == want):
            path.unlink()
            st = None
        if st is None:
            os.mknod(path, stat.S_IFCHR | 0o666, want)
            changed = True
        if stat.S_IMODE(os.lstat(path).st_mode) != 0o666:
            os.chmod(path, 0o666)
            changed = True
    # Drop nodes of an earlier, larger GPU count.
    for path in DEV_DIR.glob("nvidia[0-9]*"):
        if path.name not in device_nodes(uvm):
            path.unlink()
            changed = True
    progress(f"devices: {LAB_GPU_COUNT} fake GPUs, nvidia-uvm major {uvm} under {DEV_DIR} "
             + ("made" if changed else "in place"))
    return changed, uvm


# ----------------------------------------------------------------------------- container


def cgroup_device_key() -> str:
    """The LXC key for device rules on this host: lxc.cgroup2.devices.allow on a pure cgroup v2
    (unified) host, lxc.cgroup.devices.allow on cgroup v1 or hybrid (devices controller in v1)."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "lxc.cgroup2.devices.allow"
    return "lxc.cgroup.devices.allow"


def _config_block(ct: LabContainer, uvm: int) -> str:
    key = cgroup_device_key()
    lines = [
        CONFIG_BEGIN,
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {BRIDGE}",
        "lxc.net.0.flags = up",
        f"lxc.net.0.ipv4.address = {ct.cidr}",
        f"lxc.net.0.ipv4.gateway = {BRIDGE_IP}",
        "lxc.apparmor.profile = unconfined",
        f"{key} = a",
        "lxc.mount.auto = proc:rw sys:rw cgroup:rw",
    ]
    for name, (major, minor) in device_nodes(uvm).items():
        lines.append(f"{key} = c {major}:{minor} rwm")
        lines.append(f"lxc.mount.entry = {DEV_DIR / name} dev/{name} none bind,optional,create=file")
    lines.append(CONFIG_END)
    return "\n".join(lines) + "\n"


def _with_block(text: str, block: str) -> str:
    pattern = re.compile(rf"\n*{re.escape(CONFIG_BEGIN)}\n.*?{re.escape(CONFIG_END)}\n?", re.S)
    base = pattern.sub("\n", text).rstrip("\n")
    return base + "\n\n" + block


def _container_state(ct: LabContainer = GPU_CONTAINER) -> str:
    """RUNNING, STOPPED, ... or ABSENT."""
    if not ct.config.exists():
        return "ABSENT"
    proc = _run(_lxc(ct, "lxc-info", "-sH"), check=False, timeout=20)
    return (proc.stdout.strip() or "UNKNOWN") if proc.returncode == 0 else "UNKNOWN"


def _create_container(progress: Progress, ct: LabContainer) -> None:
    cached = (LXC_CACHE / "debian" / f"rootfs-{DEBIAN_RELEASE}-amd64").is_dir()
    progress(f"container: creating {ct.name} ({'from the debootstrap cache' if cached else 'debootstrap'} "
             f"{DEBIAN_RELEASE}, packages {' '.join(ct.packages)}; log {ct.create_log})")
    LXC_PATH.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MIRROR=DEBIAN_MIRROR, SECURITY_MIRROR=TEMPLATE_SECURITY_MIRROR,
               LXC_CACHE_PATH=str(LXC_CACHE), DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    cmd = _lxc(ct, "lxc-create", "-t", "debian", "--", "-r", DEBIAN_RELEASE,
               f"--packages={','.join(ct.packages)}", f"--mirror={DEBIAN_MIRROR}",
               f"--security-mirror={TEMPLATE_SECURITY_MIRROR}")
    with open(ct.create_log, "wb") as log:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, timeout=1800).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc != 0 or not ct.config.exists():
        raise LabError(f"lxc-create -t debian for {ct.name} failed ({_tail(ct.create_log)}): see {ct.create_log}; "
                       f"check that {DEBIAN_MIRROR} answers")


def _ensure_packages(progress: Progress, ct: LabContainer) -> bool:
    """The template skips --packages silently when its apt-get update fails: install what is missing."""
    missing = [pkg for pkg in ct.packages if not (ct.rootfs / PACKAGE_PROBES[pkg]).exists()]
    if not missing:
        return False
    progress(f"container: installing {' '.join(missing)} in the rootfs of {ct.name}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    _run(["chroot", str(ct.rootfs), "apt-get", "update"], env=env, timeout=600,
         what=f"apt-get update in the rootfs of {ct.name}", fix=f"check that {DEBIAN_MIRROR} answers")
    _run(["chroot", str(ct.rootfs), "apt-get", "install", "-y", "--no-install-recommends", *missing], env=env,
         timeout=1200, what=f"apt-get install {' '.join(missing)} in the rootfs of {ct.name}")
    return True


def _host_nameservers() -> list[str]:
    for source in (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf")):
        try:
            text = source.read_text()
        except OSError:
            continue
        servers = [m for m in re.findall(r"^\s*nameserver\s+(\S+)", text, re.M)
                   if not m.startswith("127.") and m != "::1"]
        if servers:
            return servers
    raise LabError("no usable nameserver in /etc/resolv.conf (only loopback ones, which the container "
                   "cannot reach): add a real nameserver to the host's /etc/resolv.conf")


def _ensure_rootfs(progress: Progress, ct: LabContainer, pubkey: str) -> bool:
    """Files inside the container's rootfs; True if any changed."""
    if not HOST_CA_BUNDLE.is_file():
        raise LabError(f"{HOST_CA_BUNDLE} is missing: apt-get install ca-certificates")
    changed = False
    rootfs = ct.rootfs
    etc = rootfs / "etc"
    sources = (f"deb {DEBIAN_MIRROR} {DEBIAN_RELEASE} main\n"
               f"deb {DEBIAN_MIRROR} {DEBIAN_RELEASE}-updates main\n")
    changed |= _write_if_changed(etc / "apt/sources.list", sources, 0o644)
    for extra in sorted((etc / "apt/sources.list.d").glob("*")):
        if extra.is_file() and "security.debian.org" in extra.read_text(errors="replace"):
            extra.unlink()
            changed = True
    resolv = "".join(f"nameserver {ns}\n" for ns in _host_nameservers())
    changed |= _write_if_changed(etc / "resolv.conf", resolv, 0o644)
    bundle = HOST_CA_BUNDLE.read_bytes()
    changed |= _write_if_changed(rootfs / "usr/local/share/ca-certificates/host-ca.crt", bundle, 0o644)
    # What update-ca-certificates would make of it; the bundle is the file OpenSSL and apt read.
    changed |= _write_if_changed(etc / "ssl/certs/ca-certificates.crt", bundle, 0o644)
    changed |= _write_if_changed(etc / "hostname", ct.hostname + "\n", 0o644)
    # LXC configures eth0 (static address and gateway) before init: ifupdown must leave it alone,
    # or networking.service waits for a DHCP server that is not there.
    changed |= _write_if_changed(etc / "network/interfaces",
                                 "auto lo\niface lo inet loopback\n\niface eth0 inet manual\n", 0o644)
    # The container is privileged with /sys mounted read-write: a udevd in it (initramfs-tools pulls
    # udev in) would see and re-trigger the real machine's devices. Mask it, as a real LXC guest has.
    for unit in MASKED_UNITS:
        link = etc / "systemd/system" / unit
        if not (link.is_symlink() and os.readlink(link) == "/dev/null"):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink("/dev/null", link)
            changed = True
    ssh_dir = rootfs / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(ssh_dir.stat().st_mode) != 0o700:
        os.chmod(ssh_dir, 0o700)
        changed = True
    changed |= _write_if_changed(ssh_dir / "authorized_keys", pubkey, 0o600)
    wants = etc / "systemd/system/multi-user.target.wants/ssh.service"
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/lib/systemd/system/ssh.service", wants)
        changed = True
    if not list((etc / "ssh").glob("ssh_host_ed25519_key*")):
        raise LabError(f"container {ct.name} has no ssh host key ({etc / 'ssh'}): run `gpunode lab down` and "
                       "`gpunode lab up` to rebuild it")
    progress(f"container: {ct.name} rootfs (apt sources, resolv.conf, CA bundle, hostname, ssh key) "
             + ("updated" if changed else "in place"))
    return changed


def _ensure_model_stand_in(progress: Progress, ct: LabContainer) -> bool:
    folder = ct.rootfs / LAB_MODEL_DIR.lstrip("/")
    changed = False
    for name, text in LAB_MODEL_FILES.items():
        changed |= _write_if_changed(folder / name, text, 0o644)
    progress(f"container: {ct.name} model stand-in {LAB_MODEL_DIR} " + ("written" if changed else "in place"))
    return changed


def _ensure_server_stand_in(progress: Progress) -> bool:
    """The fake SGLang server's image on this machine's engine (the image stage ships it to the node)."""
    import docker

    from gpunode.labimage import ensure_fake_image, fake_tag

    client = docker.from_env()
    tag = fake_tag()  # hashes the fake's files: once
    had = bool(client.images.list(name=tag))
    if not had:
        progress(f"docker: building the stand-in server image {tag} (debootstrap, 1-2 minutes the first time)")
    try:
        tag = ensure_fake_image(client)
    except (docker.errors.DockerException, RuntimeError, subprocess.SubprocessError) as exc:
        raise LabError(f"the stand-in server image could not be built: {_one_line(str(exc))}") from exc
    progress(f"docker: stand-in server image {tag} " + ("built" if not had else "in place"))
    return not had


def _facts_tarball() -> Path:
    from gpunode.paths import checkout_root

    return checkout_root() / HOST_FACTS_TARBALL


def _ensure_driver_layout(progress: Progress, ct: LabContainer) -> bool:
    """The NVIDIA driver's files as recorded on the H200 (names, SONAME links, the real ld cache;
    stand-in contents) under LAB_HOST_FACTS_ROOT, where the host stage builds its driver tree from."""
    from gpunode import labdriver
    from gpunode.paths import checkout_root

    fixture = checkout_root() / HOST_DRIVER_LAYOUT
    if not (fixture / "layout.json").is_file():
        raise LabError(f"the recorded driver layout {fixture} is missing: check out the whole repository "
                       "(tests/fixtures/host/h200/driver/) or set GPUNODE_HOME to it")
    changed = labdriver.lay_out(fixture, ct.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/"))
    progress(f"facts: driver layout in {LAB_HOST_FACTS_ROOT} in {ct.name} {'written' if changed else 'in place'}")
    return changed


def _ensure_host_facts(progress: Progress, ct: LabContainer) -> bool:
    """Unpack the recorded H200 host files into ct's rootfs at LAB_HOST_FACTS_ROOT (without the
    tarball's top folder `sysroot/`); redone only when the tarball's sha256 changed."""
    tarball = _facts_tarball()
    if not tarball.is_file():
        raise LabError(f"recorded host facts {tarball} are missing: check out the whole repository "
                       "(tests/fixtures/host/h200/) or set GPUNODE_HOME to it")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    dest = ct.rootfs / LAB_HOST_FACTS_ROOT.lstrip("/")
    stamp = ct.dir / "facts.sha256"
    if dest.is_dir() and stamp.is_file() and stamp.read_text().strip() == digest:
        progress(f"facts: {LAB_HOST_FACTS_ROOT} in {ct.name} in place")
        return False
    tmp = dest.with_name(dest.name + ".gpunode-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o755)
    with tarfile.open(tarball) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not parts or parts[0] != "sysroot":
                raise LabError(f"{tarball}: member {member.name!r} is outside sysroot/: re-record the host facts")
            if len(parts) == 1:
                continue
            if not (member.isfile() or member.isdir() or member.issym()):
                raise LabError(f"{tarball}: member {member.name!r} is not a file, folder or symlink")
            target = os.path.normpath(os.path.join(*parts[1:-1], member.linkname)) if member.issym() else ""
            if member.issym() and (member.linkname.startswith("/") or target.split(os.sep)[0] == ".."):
                raise LabError(f"{tarball}: symlink {member.name!r} -> {member.linkname!r} leaves the sysroot")
            if ".." in parts:
                raise LabError(f"{tarball}: member {member.name!r} has '..' in its path")
            member.name = str(Path(*parts[1:]))
            members.append(member)
        # Members checked above; "tar" keeps the symlink and owner root:root.
        tar.extractall(tmp, members=members, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    stamp.write_text(digest + "\n")
    progress(f"facts: {tarball.name} unpacked to {LAB_HOST_FACTS_ROOT} in {ct.name}")
    return True


def _ensure_ssh_key() -> tuple[bool, str]:
    SSH_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)
    changed = False
    if not SSH_KEY.exists() or not SSH_PUBKEY.exists():
        for path in (SSH_KEY, SSH_PUBKEY):
            path.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpunode-lab", "-f", str(SSH_KEY)],
             what="ssh-keygen")
        changed = True
    return changed, SSH_PUBKEY.read_text()


def _known_hosts_text() -> str:
    """One line per lab container that has a host key, GPU node first."""
    lines = []
    for ct in LAB_CONTAINERS:
        with contextlib.suppress(OSError, IndexError):
            key = (ct.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{ct.ip} {key[0]} {key[1]}\n")
    return "".join(lines)


def ssh_command(*remote: str, host: str = CONTAINER_IP, batch: bool = True) -> list[str]:
    """The ssh command line that runs `remote` as root in a lab container: the GPU node (default)
    or, with host=HOST_CONTAINER_IP, the Proxmox host stand-in."""
    opts = ["-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR"]
    if batch:
        opts += ["-o", "BatchMode=yes"]
    return ["ssh", *opts, f"root@{host}", *remote]


def _ssh_works(ct: LabContainer = GPU_CONTAINER) -> bool:
    return _ok(ssh_command("true", host=ct.ip), timeout=20)


def _wait_for_ssh(ct: LabContainer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with socket.create_connection((ct.ip, 22), timeout=2):
                if _ssh_works(ct):
                    return
        time.sleep(1)
    proc = _run(ssh_command("true", host=ct.ip), check=False, timeout=20)
    raise LabError(f"ssh root@{ct.ip} does not work after {timeout:.0f} s "
                   f"({_one_line(proc.stderr) or 'no answer'}): see {ct.start_log} and "
                   f"`lxc-attach -P {LXC_PATH} -n {ct.name} -- systemctl status ssh`")


def _start_container(progress: Progress, ct: LabContainer) -> None:
    progress(f"container: starting {ct.name}")
    _run(_lxc(ct, "lxc-start", "-d", "-o", str(ct.start_log), "-l", "INFO"), timeout=60,
         what=f"lxc-start {ct.name}", fix=f"see {ct.start_log}")
    _run(_lxc(ct, "lxc-wait", "-s", "RUNNING", "-t", "30"), timeout=40, what=f"waiting for {ct.name}",
         fix=f"see {ct.start_log}")


def _stop_container(progress: Progress, ct: LabContainer) -> None:
    progress(f"container: stopping {ct.name}")
    proc = _run(_lxc(ct, "lxc-stop", "-t", "20"), check=False, timeout=60)
    if proc.returncode != 0 and _container_state(ct) != "STOPPED":
        _run(_lxc(ct, "lxc-stop", "-k"), timeout=30, what=f"lxc-stop -k {ct.name}")


def _ensure_container(progress: Progress, ct: LabContainer, uvm: int) -> bool:
    changed = False
    key_changed, pubkey = _ensure_ssh_key()
    changed |= key_changed
    state = _container_state(ct)
    if state == "ABSENT":
        _create_container(progress, ct)
        changed = True
        state = "STOPPED"
    elif state not in ("RUNNING", "STOPPED"):
        raise LabError(f"container {ct.name} is {state}: run `gpunode lab down` then `gpunode lab up`")
    if state == "STOPPED":
        changed |= _ensure_packages(progress, ct)
    config = ct.config.read_text()
    new_config = _with_block(config, _config_block(ct, uvm))
    config_changed = new_config != config
    if config_changed:
        _write_if_changed(ct.config, new_config)
        progress(f"container: config block in {ct.config} written")
    rootfs_changed = _ensure_rootfs(progress, ct, pubkey)
    changed |= config_changed or rootfs_changed
    if ct.facts:
        changed |= _ensure_host_facts(progress, ct)
        changed |= _ensure_driver_layout(progress, ct)
    started = False
    if state == "RUNNING" and (config_changed or rootfs_changed and not _ssh_works(ct)):
        _stop_container(progress, ct)
        state = "STOPPED"
    if state != "RUNNING":
        _start_container(progress, ct)
        changed = started = True
    else:
        progress(f"container: {ct.name} running")
    changed |= _write_if_changed(KNOWN_HOSTS, _known_hosts_text(), 0o644)
    _wait_for_ssh(ct, 90 if started else 20)
    progress(f"ssh: root@{ct.ip} answers")
    if started:
        proc = _run(ssh_command("apt-get", "-q", "update", host=ct.ip), check=False, timeout=180)
        if proc.returncode != 0 or re.search(r"^(W|E): ", proc.stdout + proc.stderr, re.M):
            raise LabError(f"apt-get update in {ct.name} failed ({_one_line(proc.stderr) or _one_line(proc.stdout)}): "
                           f"check NAT (iptables -t nat -S POSTROUTING) and DNS ({ct.rootfs / 'etc/resolv.conf'})")
        progress(f"container: apt-get update in {ct.name} works (NAT and DNS)")
    return changed


# ----------------------------------------------------------------------------- fakepve


def _pve_password() -> str:
    return PVE_PASSWORD_FILE.read_text()


def pve_ticket(password: str | None = None, cafile: str | None = None, timeout: float = 5) -> dict[str, object]:
    """POST /access/ticket to fakepve, verifying TLS against cafile (default LAB_DIR/pve/ca.pem);
    returns the `data` of the answer. Raises urllib/ssl errors as they come."""
    ctx = ssl.create_default_context(cafile=cafile or str(PVE_CA))
    body = urllib.parse.urlencode({"username": PVE_USER,
                                   "password": _pve_password() if password is None else password}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(urllib.request.Request(f"{PVE_URL}/api2/json/access/ticket", data=body), timeout=timeout) as r:
        data = json.load(r)["data"]
    if not isinstance(data, dict) or "ticket" not in data:
        raise ValueError(f"no ticket in the answer: {data!r}")
    return data


def _pve_answers() -> bool:
    try:
        pve_ticket()
        return True
    except (OSError, ValueError, KeyError, ssl.SSLError):
        return False


def _stop_pve() -> bool:
    pid = _read_pid(PVE_PID_FILE)
    stopped = False
    if pid and _pid_alive(pid, "fakepve"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(50):
            if not _pid_alive(pid, "fakepve"):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stopped = True
    PVE_PID_FILE.unlink(missing_ok=True)
    return stopped


def _ensure_pve(progress: Progress) -> bool:
    changed = False
    PVE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(PVE_DIR, 0o755)
    if _run([sys.executable, "-c", "import fakepve.certs, cryptography"], check=False).returncode != 0:
        raise LabError(f"fakepve is not installed for {sys.executable}: pip install 'gpunode[test]' "
                       "(fakepve[crypto])")
    if not PVE_PASSWORD_FILE.is_file() or not PVE_PASSWORD_FILE.read_text():
        changed |= _write_if_changed(PVE_PASSWORD_FILE, secrets.token_urlsafe(24), 0o600)
    elif stat.S_IMODE(PVE_PASSWORD_FILE.stat().st_mode) != 0o600:
        os.chmod(PVE_PASSWORD_FILE, 0o600)
        changed = True
    changed |= _write_if_changed(PVE_GUESTS, json.dumps({"guests": []}) + "\n", 0o644)
    cert_old = not PVE_CERT.is_file() or not PVE_KEY.is_file() or \
        time.time() - PVE_CERT.stat().st_mtime > CERT_MAX_AGE_S
    if cert_old:
        code = ("import sys; from fakepve.certs import make_cert; "
                "make_cert(sys.argv[1], name='fakepve', hosts=(sys.argv[2],))")
        _run([sys.executable, "-c", code, str(PVE_DIR), PVE_HOST], what="fakepve.certs.make_cert")
        changed = True
    changed |= _write_if_changed(PVE_CA, PVE_CERT.read_bytes(), 0o644)
    pid = _read_pid(PVE_PID_FILE)
    running = pid is not None and _pid_alive(pid, "fakepve")
    # A lab made before gpunode.labpve runs plain `python -m fakepve`: that one is replaced.
    current = running and pid is not None and _pid_alive(pid, PVE_MODULE)
    if current and not changed and _pve_answers():
        progress(f"fakepve: answering on {PVE_URL}")
        return False
    if running:
        _stop_pve()
    progress(f"fakepve: starting on {PVE_URL} (log {PVE_LOG})")
    # The command line names fakepve (its certificate, PVE_CERT): _stop_pve finds the process by
    # that word.
    cmd = [sys.executable, "-m", PVE_MODULE, str(PVE_GUESTS), "--host", PVE_HOST, "--port", str(PVE_PORT),
           "--user", PVE_USER, "--time-scale", "0", "--cert", str(PVE_CERT), "--key", str(PVE_KEY),
           "--lxcpath", str(LXC_PATH), "--host-rootfs", str(HOST_ROOTFS), "--state", str(PVE_MOUNTS)]
    env = dict(os.environ, PVE_PASS=_pve_password())
    env.pop("PVE_USER", None)
    with open(PVE_LOG, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, close_fds=True)
    PVE_PID_FILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            PVE_PID_FILE.unlink(missing_ok=True)
            raise LabError(f"fakepve exited with status {proc.returncode}: {_tail(PVE_LOG)} (see {PVE_LOG}; "
                           f"is {PVE_HOST}:{PVE_PORT} taken?)")
        if _pve_answers():
            progress(f"fakepve: answering on {PVE_URL}")
            return True
        time.sleep(0.3)
    raise LabError(f"fakepve did not answer a ticket request on {PVE_URL} within 30 s: see {PVE_LOG}")


# ----------------------------------------------------------------------------- public API


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


def up(progress: Progress = _noop) -> LabInfo:
    """Bring the lab up (idempotent: a second run changes nothing); returns how to reach it."""
    start = time.monotonic()
    _require_root()
    _require_commands(list(REQUIRED_COMMANDS))
    changed: list[str] = []
    with _locked():
        if _ensure_docker(progress):
            changed.append("docker")
        if _ensure_network(progress):  # after dockerd, which rewrites iptables
            changed.append("network")
        dev_changed, uvm = _ensure_devices(progress)
        if dev_changed:
            changed.append("devices")
        if _ensure_container(progress, GPU_CONTAINER, uvm):
            changed.append("container")
        if _ensure_model_stand_in(progress, GPU_CONTAINER):
            changed.append("model")
        if _ensure_server_stand_in(progress):
            changed.append("server_image")
        if _ensure_pve(progress):
            changed.append("fakepve")
        if _ensure_container(progress, HOST_CONTAINER, uvm):
            changed.append("host_container")
        if labkernels.ensure(progress):
            changed.append("kernels")
    seconds = time.monotonic() - start
    progress(f"lab up in {seconds:.1f} s" + (f" (changed: {', '.join(changed)})" if changed else " (no change)"))
    return _info(uvm, changed, seconds)


def down(purge: bool = False, progress: Progress = _noop) -> None:
    """Take the lab apart: fakepve, both containers, the iptables rules and the bridge; with purge
    also LAB_DIR (keys, certificates, the debootstrap cache). Docker Engine is left running."""
    _require_root()
    _require_commands(["ip", "iptables", "lxc-stop", "lxc-destroy", "lxc-info"])
    if not LAB_DIR.exists():
        _remove_network(progress)
        progress("lab: nothing else to remove")
        return
    with _locked():
        progress("fakepve: stopped" if _stop_pve() else "fakepve: not running")
        for ct in reversed(LAB_CONTAINERS):
            state = _container_state(ct)
            if state != "ABSENT":
                if state != "STOPPED":
                    _stop_container(progress, ct)
                _run(_lxc(ct, "lxc-destroy"), timeout=300, what=f"lxc-destroy {ct.name}")
                progress(f"container: {ct.name} destroyed")
            else:
                progress(f"container: {ct.name} absent")
        KNOWN_HOSTS.unlink(missing_ok=True)
        _remove_network(progress)
    if purge:
        shutil.rmtree(LAB_DIR)
        progress(f"lab: {LAB_DIR} removed")


def _devices_in_container(ct: LabContainer = GPU_CONTAINER) -> dict[str, str]:
    """name -> "major:minor" of the /dev/nvidia* char nodes inside the running container."""
    proc = _run(_lxc(ct, "lxc-attach", "--", "sh", "-c", "stat -c '%n %F %t %T' /dev/nvidia* 2>/dev/null || true"),
                check=False, timeout=20)
    seen: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"/dev/(\S+) character special file ([0-9a-f]+) ([0-9a-f]+)$", line.strip())
        if m:
            seen[m.group(1)] = f"{int(m.group(2), 16)}:{int(m.group(3), 16)}"
    return seen


def _container_status(ct: LabContainer, root: bool) -> dict[str, object]:
    """name, lxc_path, state, ip, devices ("name" -> "major:minor" inside), ssh, and ok (all fine)."""
    state = _container_state(ct) if root else "UNKNOWN"
    ip = None
    devices: dict[str, str] = {}
    if state == "RUNNING":
        proc = _run(_lxc(ct, "lxc-info", "-iH"), check=False, timeout=20)
        ips = proc.stdout.split()
        ip = ips[0] if ips else None
        devices = _devices_in_container(ct)
    ssh = state == "RUNNING" and KNOWN_HOSTS.exists() and _ssh_works(ct)
    return {"name": ct.name, "lxc_path": str(LXC_PATH), "state": state, "ip": ip, "devices": devices, "ssh": ssh,
            "ok": state == "RUNNING" and ip == ct.ip and ssh}


def status() -> dict[str, object]:
    """What is there now, as a JSON-able dict; `up` is True when every part works. Never raises."""
    out: dict[str, object] = {"lab_dir": str(LAB_DIR), "root": os.geteuid() == 0}
    try:
        out["dockerd"] = _docker_running()
        exists, has_addr, is_up = _bridge_state()
        out["bridge"] = {"name": BRIDGE, "present": exists, "address": BRIDGE_CIDR if has_addr else None,
                         "up": is_up}
        out["iptables"] = all(_ok(["iptables", "-w", "-t", t, "-C", *spec]) for t, spec, _ in _iptables_rules())
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
        out["fakepve"] = {"url": PVE_URL, "node": PVE_NODE, "answering": PVE_PASSWORD_FILE.exists() and _pve_answers()}
        out["up"] = bool(out["dockerd"] and exists and has_addr and is_up and out["iptables"] and expected
                         and gpu["ok"] and gpu["devices"] == expected
                         and host["ok"] and host["devices"] == expected and host["facts"]
                         and out["fakepve"]["answering"])  # type: ignore[index]
        gpu.pop("ok")
        host.pop("ok")
    except (OSError, LabError) as exc:
        out["error"] = str(exc)
        out["up"] = False
    return out

