"""Read-only facts of a GPU host, from files only (no commands), under a root prefix.

Plain Python so that it runs as module_utils on the Proxmox host, and as a script on the GPU
machine that recorded the fixtures. Every path is read under ``root`` so tests and the lab can
point it at a tree of recorded readings. The findings (what is wrong, and the fix) are computed
from these facts on the controller, by gpunode.stages.host.
"""

from __future__ import annotations

import os
import re

NVIDIA_VENDOR = "0x10de"


def _read(root: str, path: str) -> str | None:
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def os_release(root: str) -> dict[str, str]:
    text = _read(root, "/etc/os-release") or ""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def dpkg_version(root: str, package: str) -> str | None:
    """Installed version of a Debian package, from dpkg's status file."""
    text = _read(root, "/var/lib/dpkg/status") or ""
    for block in text.split("\n\n"):
        if re.search(rf"^Package: {re.escape(package)}$", block, re.M) and "Status: install ok installed" in block:
            match = re.search(r"^Version: (\S+)$", block, re.M)
            return match.group(1) if match else None
    return None


def driver(root: str) -> dict[str, object]:
    """The loaded NVIDIA kernel module: version, and whether it is the open one."""
    text = _read(root, "/proc/driver/nvidia/version")
    module_version = _read(root, "/sys/module/nvidia/version")
    version = module_version
    if text and not version:
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
        version = match.group(1) if match else None
    return {
        "loaded": text is not None or module_version is not None,
        "version": version,
        "open": bool(text and "Open Kernel Module" in text),
        "banner": (text or "").splitlines()[0] if text else None,
    }


def uvm(root: str) -> dict[str, object]:
    loaded = os.path.isdir(os.path.join(root, "sys/module/nvidia_uvm"))
    hmm = _read(root, "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm")
    return {"loaded": loaded, "uvm_disable_hmm": hmm}


def kernel_cmdline(root: str) -> dict[str, object]:
    cmdline = _read(root, "/proc/cmdline") or ""
    args: dict[str, str] = {}
    for token in cmdline.split():
        key, _sep, value = token.partition("=")
        args[key] = value
    return {
        "cmdline": cmdline,
        "intel_iommu": args.get("intel_iommu"),
        "amd_iommu": args.get("amd_iommu"),
        "iommu": args.get("iommu"),
        "vfio_pci_ids": [i for i in args.get("vfio-pci.ids", "").split(",") if i],
        "release": _read(root, "/proc/sys/kernel/osrelease"),
    }


def pci_gpus(root: str) -> list[dict[str, object]]:
    """NVIDIA display/3D controllers, with the driver bound to each."""
    base = os.path.join(root, "sys/bus/pci/devices")
    out: list[dict[str, object]] = []
    if not os.path.isdir(base):
        return out
    for bus_id in sorted(os.listdir(base)):
        rel = f"/sys/bus/pci/devices/{bus_id}"
        if _read(root, f"{rel}/vendor") != NVIDIA_VENDOR:
            continue
        pci_class = _read(root, f"{rel}/class") or ""
        if not pci_class.startswith("0x03"):
            continue  # audio functions and the like
        link = os.path.join(root, rel.lstrip("/"), "driver")
        bound = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
        out.append({
            "bus_id": bus_id,
            "device_id": _read(root, f"{rel}/device"),
            "class": pci_class,
            "driver": bound,
            "numa_node": _read(root, f"{rel}/numa_node"),
            "current_link_speed": _read(root, f"{rel}/current_link_speed"),
            "current_link_width": _read(root, f"{rel}/current_link_width"),
            "max_link_speed": _read(root, f"{rel}/max_link_speed"),
            "max_link_width": _read(root, f"{rel}/max_link_width"),
        })
    return out


def modprobe_options(root: str) -> list[dict[str, str]]:
    """Lines of /etc/modprobe.d that configure vfio or nvidia modules, with their file."""
    folder = os.path.join(root, "etc/modprobe.d")
    out: list[dict[str, str]] = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".conf"):
            continue
        for line in (_read(root, f"/etc/modprobe.d/{name}") or "").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and re.search(r"\b(vfio|nvidia)", line):
                out.append({"file": f"/etc/modprobe.d/{name}", "line": line})
    return out


def persistenced(root: str) -> dict[str, object]:
    # The daemon's socket exists while it runs: a file check, so it also works under a root prefix.
    return {"running": os.path.exists(os.path.join(root, "run/nvidia-persistenced/socket")),
            "installed": any(os.path.exists(os.path.join(root, p)) for p in
                             ("usr/bin/nvidia-persistenced", "lib/systemd/system/nvidia-persistenced.service",
                              "etc/systemd/system/nvidia-persistenced.service"))}


def gather(root: str = "/", config_root: str | None = None) -> dict[str, object]:
    """Runtime state (/proc, /sys, /run) under ``root``; configuration (/etc, dpkg) under
    ``config_root`` (default: the same). The lab replays recorded runtime state while the
    configuration the stage edits is the lab host's own."""
    config_root = root if config_root is None else config_root
    return {
        "root": root,
        "config_root": config_root,
        "os": os_release(config_root),
        "pve_manager": dpkg_version(config_root, "pve-manager"),
        "kernel": kernel_cmdline(root),
        "gpus": pci_gpus(root),
        "driver": driver(root),
        "uvm": uvm(root),
        "modprobe": modprobe_options(config_root),
        "persistenced": persistenced(root),
    }
