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
  recorded on a real H200 machine (recorded/h200/sysroot.tar.gz) unpacked at
  /var/lib/gpunode-lab-facts;
* the lab's Hub (``hub``, run as a systemd service by ``hubservice``) on ``gpunode-lab-host``'s loopback,
  serving a checkpoint made by ``checkpoint``, which inventory/lab/host.yml fetches into the store
  /srv/gpunode-models on that host;
* two more sites for the fleet (inventory/lab/fleet.yml), each another Proxmox host stand-in with its
  own fakepve and GPU node: pve-lab1 (``gpunode-lab-host1`` 10.0.3.15, https://127.0.0.4:8006,
  ``gpunode-lab1`` 10.0.3.14) and pve-lab2 (``gpunode-lab-host2`` 10.0.3.13, https://127.0.0.3:8006,
  ``gpunode-lab2`` 10.0.3.12), and the API key the fleet's servers and router share.

`down()` takes it apart again; `status()` reports what is there. Failures raise `LabError` with
a one-line message naming what failed and how to fix it.

The package, cut along what it builds: ``contract`` (names, addresses, paths), ``util``, ``engine``
(Docker), ``network``, ``devices``, ``containers``, ``fakepve`` (the API's process), ``api`` (up,
down, status); the stand-ins it runs: ``pve`` (fakepve plus the realizer of mount points),
``driver`` (the recorded driver layout), ``kernels`` (stand-in kernels, real DKMS), ``hub`` and
``hubservice`` (the Hub stand-in and its service), ``checkpoint`` and ``weights`` (the checkpoints), ``image`` (the
stand-in server's image) and ``standin/`` (the fake SGLang server's files); ``recorded/`` holds the
readings from a real H200 that it lays out. Production code never imports it; a lab host file
(``lab: true``) names its stand-ins.
"""

from __future__ import annotations

from gpunode_lab.api import down, status, up
from gpunode_lab.containers import cgroup_device_key, ssh_command
from gpunode_lab.contract import (
    BRIDGE, BRIDGE_CIDR, BRIDGE_IP, CONFIG_BEGIN, CONFIG_END, CONTAINER_CONFIG, CONTAINER_HOSTNAME, CONTAINER_IP,
    CONTAINER_NAME, DEV_DIR, GPU_CONTAINER, HOST_CA_BUNDLE, HOST_CONTAINER, HOST_CONTAINER_HOSTNAME,
    HOST_CONTAINER_IP, HOST_CONTAINER_NAME, HOST_DRIVER_LAYOUT, HOST_ROOTFS, IPTABLES_COMMENT, KNOWN_HOSTS,
    LAB_CONTAINERS, LAB_DIR, LAB_GPU_COUNT, LAB_HOST_FACTS_ROOT, LAB_SUBNET, LXC_PATH, NVIDIA_MAJOR, PVE_CA,
    PVE_HOST, PVE_MODULE, PVE_MOUNTS, PVE_NODE, PVE_PASSWORD_FILE, PVE_PID_FILE, PVE_PORT, PVE_URL, PVE_USER,
    FLEET_API_KEY, RECORDED, ROOTFS, FLEET_SITES, SITE, SITE1, SITE2, SITES, STANDIN, UVM_MAJOR_FILE, LabContainer, LabError, LabInfo,
    LabSite,
)
from gpunode_lab.devices import device_nodes, uvm_major
from gpunode_lab.fakepve import pve_answers, pve_ticket, stop_pve

__all__ = [
    "BRIDGE", "BRIDGE_CIDR", "BRIDGE_IP", "CONFIG_BEGIN", "CONFIG_END", "CONTAINER_CONFIG", "CONTAINER_HOSTNAME",
    "CONTAINER_IP", "CONTAINER_NAME", "DEV_DIR", "GPU_CONTAINER", "HOST_CA_BUNDLE", "HOST_CONTAINER",
    "HOST_CONTAINER_HOSTNAME", "HOST_CONTAINER_IP", "HOST_CONTAINER_NAME", "HOST_DRIVER_LAYOUT", "HOST_ROOTFS",
    "FLEET_API_KEY", "FLEET_SITES", "IPTABLES_COMMENT", "KNOWN_HOSTS", "LAB_CONTAINERS", "LAB_DIR", "LAB_GPU_COUNT", "LAB_HOST_FACTS_ROOT",
    "LAB_SUBNET", "LXC_PATH", "NVIDIA_MAJOR", "PVE_CA", "PVE_HOST", "PVE_MODULE", "PVE_MOUNTS", "PVE_NODE",
    "PVE_PASSWORD_FILE", "PVE_PID_FILE", "PVE_PORT", "PVE_URL", "PVE_USER", "RECORDED", "ROOTFS", "SITE", "SITE1", "SITE2",
    "SITES", "STANDIN", "UVM_MAJOR_FILE", "LabContainer", "LabError", "LabInfo", "LabSite", "cgroup_device_key",
    "device_nodes", "down", "pve_answers", "pve_ticket", "ssh_command", "status", "stop_pve", "up", "uvm_major",
]
