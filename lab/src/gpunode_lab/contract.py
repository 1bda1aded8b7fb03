"""The lab's fixed contract: its names, addresses, paths and what it builds, in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpunode.ground.nvidia import GPU_MAJOR

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
# The finished container's sources name deb.debian.org's bookworm, bookworm-updates and its
# security archive: the template installs from security, so a package built against those updates
# (python3.11-venv for python3.11) is only installable with it, as on a real Debian 12.
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
# What the lab ships with it: the readings recorded on a real H200 (recorded/), and the stand-in
# SGLang server (standin/), both package data.
RECORDED = Path(__file__).resolve().parent / "recorded"
STANDIN = Path(__file__).resolve().parent / "standin"
HOST_FACTS_TARBALL = RECORDED / "h200" / "sysroot.tar.gz"
HOST_DRIVER_LAYOUT = RECORDED / "h200" / "driver"  # what gpunode_lab.driver lays out
# What NVML answered gpunode's GPU exporter on a real H200 (tests/fixtures/monitor/record.py): the
# stand-in image's NVML replays it for each GPU the container is handed (standin/lab_nvml.py).
NVML_RECORDING = RECORDED / "h200" / "nvml"
DKMS_STANDIN = RECORDED / "dkms-standin"  # the module DKMS builds for each lab kernel
# package -> a file it installs (to find what the template failed to install)
PACKAGE_PROBES = {"openssh-server": "usr/sbin/sshd", "python3": "usr/bin/python3",
                  "ca-certificates": "usr/sbin/update-ca-certificates", "sudo": "usr/bin/sudo",
                  "initramfs-tools": "usr/sbin/update-initramfs", "kmod": "usr/bin/kmod"}
MASKED_UNITS = ("systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
                "systemd-udevd-control.socket", "systemd-udevd-kernel.socket")

# The model folder in the lab's nodes: the store's revision mounted there (the first site), or the lab's
# checkpoint (gpunode_lab.weights) made in the node (model.source: node_path, the second site); the
# model stage verifies it and the stand-in server reads it.
LAB_MODEL_DIR = "/models/GLM-5-NVFP4"

# The Hub of inventory/lab/host.yml (model.source: hub): gpunode_lab.hub, a systemd service on the lab
# Proxmox host's loopback (stdlib only, run by the host's python3), serving a checkpoint made by
# gpunode_lab.checkpoint; the model stage fetches it from there into the store on that host, which the
# container stage mounts at LAB_MODEL_DIR in the node.
HUB_PORT = 8731
HUB_URL = f"http://127.0.0.1:{HUB_PORT}"
HUB_CODE = "/opt/gpunode-lab-hub/hub.py"
HUB_ROOT = "/srv/gpunode-lab-hub"
HUB_REPO = "lukealonso/GLM-5-NVFP4"
HUB_UNIT = "gpunode-lab-hub.service"
HUB_SHARDS, HUB_SHARD_BYTES = 3, 1 << 20
LAB_STORE = "/srv/gpunode-models"

NVIDIA_MAJOR = GPU_MAJOR  # the fake nodes carry the driver's numbers
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
# fakepve runs inside gpunode_lab.pve, which also realizes bind mount points (mpN) on the lab's LXC
# containers; what it mounted is kept in PVE_MOUNTS.
PVE_MODULE = "gpunode_lab.pve"
LXC_PATH = LAB_DIR / "lxc"  # lxcpath: pass -P LXC_PATH to lxc-* commands
LXC_CACHE = LAB_DIR / "cache"  # the lxc-debian template's debootstrap cache
DOCKERD_LOG = LAB_DIR / "dockerd.log"
LOCK_FILE = LAB_DIR / ".lock"

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONFIG_BEGIN = "# >>> gpunode-lab: managed by gpunode_lab, rewritten by `gpunode lab up`"
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


@dataclass(frozen=True)
class LabSite:
    """One Proxmox host of the lab: its API (a fakepve of its own on a loopback address, with its own
    CA and root@pam password under ``pve_dir``), the container that plays the host, and its GPU node."""

    name: str  # the host file's name for it (inventory/lab/fleet.yml)
    gpu: LabContainer
    host: LabContainer
    pve_host: str
    pve_dir: Path
    # The kernel repair's scenario lives here (a kernel left without headers or module); else one
    # stand-in kernel with its DKMS module built.
    kernels: bool = False
    # Its host runs the lab's Hub and its host file fetches from there (model.source: hub); else the
    # node holds the lab's checkpoint itself (model.source: node_path).
    hub: bool = False

    @property
    def pve_url(self) -> str:
        return f"https://{self.pve_host}:{PVE_PORT}"

    @property
    def pve_ca(self) -> Path:
        return self.pve_dir / "ca.pem"

    @property
    def pve_cert(self) -> Path:
        return self.pve_dir / "fakepve.crt"

    @property
    def pve_key(self) -> Path:
        return self.pve_dir / "fakepve.key"

    @property
    def pve_password_file(self) -> Path:
        return self.pve_dir / "password"

    @property
    def pve_pid_file(self) -> Path:
        return self.pve_dir / "fakepve.pid"

    @property
    def pve_log(self) -> Path:
        return self.pve_dir / "fakepve.log"

    @property
    def pve_guests(self) -> Path:
        return self.pve_dir / "guests.json"

    @property
    def pve_mounts(self) -> Path:
        return self.pve_dir / "mounts.json"


# The first site is the lab of inventory/lab/host.yml (the kernel repair's stand-ins and the Hub
# stay on it); the other two are the fleet of inventory/lab/fleet.yml, pve-lab1 (its router's
# node) and pve-lab2. The fleet has sites of its own so that its tests run beside the one-host
# tests, each group on its own machines (tests/conftest.py).
SITE = LabSite("pve-lab", GPU_CONTAINER, HOST_CONTAINER, PVE_HOST, PVE_DIR, kernels=True, hub=True)
SITE1 = LabSite("pve-lab1", LabContainer("gpunode-lab1", "10.0.3.14", "gpunode-lab1"),
                LabContainer("gpunode-lab-host1", "10.0.3.15", "gpunode-lab-host1", HOST_CONTAINER_PACKAGES, facts=True),
                "127.0.0.4", LAB_DIR / "pve1")
SITE2 = LabSite("pve-lab2", LabContainer("gpunode-lab2", "10.0.3.12", "gpunode-lab2"),
                LabContainer("gpunode-lab-host2", "10.0.3.13", "gpunode-lab-host2", HOST_CONTAINER_PACKAGES, facts=True),
                "127.0.0.3", LAB_DIR / "pve2")
SITES = (SITE, SITE1, SITE2)
FLEET_SITES = (SITE1, SITE2)
# The first site's API files, by the names the lab's tests know them.
PVE_CA, PVE_CERT, PVE_KEY = SITE.pve_ca, SITE.pve_cert, SITE.pve_key
PVE_PASSWORD_FILE, PVE_PID_FILE, PVE_LOG = SITE.pve_password_file, SITE.pve_pid_file, SITE.pve_log
PVE_GUESTS, PVE_MOUNTS = SITE.pve_guests, SITE.pve_mounts
LAB_CONTAINERS = tuple(ct for site in SITES for ct in (site.gpu, site.host))
# The API key the fleet's servers and router share (inventory/lab/fleet.yml), made by `lab up`.
FLEET_API_KEY = LAB_DIR / "fleet" / "api-key"
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
