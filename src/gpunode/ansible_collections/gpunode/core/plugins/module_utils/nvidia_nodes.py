"""Shared by gpunode's modules: the NVIDIA device nodes of a machine, and /proc/devices.

Plain Python (no Ansible imports), so the same code runs as module_utils on a target and as a
script on the GPU machine that recorded the fixtures.
"""

from __future__ import annotations

import errno
import os
import re
import stat

# The NVIDIA device nodes, one definition for gpunode (FIELD-NOTES s2): the package reads them from
# here (gpunode.ground.nvidia), the roles' defaults carry copies a unit test holds equal to these.
GPU_MAJOR = 195  # /dev/nvidiaN is char 195:N; nvidiactl 195:255, nvidia-modeset 195:254
GPU_NODE = re.compile(r"^nvidia(\d+)$")
# Every CUDA process needs these besides one /dev/nvidiaN per GPU; the nvidia-uvm pair has a
# dynamic major (read /proc/devices) and appears only once something loads nvidia-uvm.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# Handed in where the host has it.
OPTIONAL_NODES = ("/dev/nvidia-modeset",)
CAPS_DIR = "/dev/nvidia-caps"  # MIG capability nodes, handed in only with MIG
DEV_MODE = "0666"  # what the NVIDIA driver itself gives these nodes on the host
# The minors the driver gives the control nodes: nvidiactl and nvidia-modeset on GPU_MAJOR, the
# nvidia-uvm pair 0 and 1 on its own dynamic major.
MINORS = {"/dev/nvidiactl": 255, "/dev/nvidia-modeset": 254, "/dev/nvidia-uvm": 0, "/dev/nvidia-uvm-tools": 1}
UVM_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NAMED = tuple(path[len("/dev/"):] for path in CONTROL_NODES + OPTIONAL_NODES)


def proc_devices(path: str = "/proc/devices") -> dict[str, int]:
    """Char majors by name; nvidia-uvm's major is dynamic and only readable here."""
    majors: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as handle:
            section = ""
            for line in handle:
                line = line.strip()
                if line.endswith(":"):
                    section = line
                    continue
                parts = line.split()
                if section.startswith("Character") and len(parts) == 2 and parts[1].startswith("nvidia"):
                    majors[parts[1]] = int(parts[0])
    except OSError:
        pass
    return majors


def describe(path: str, try_open: bool) -> dict[str, object] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    entry: dict[str, object] = {
        "char": stat.S_ISCHR(info.st_mode),
        "major": os.major(info.st_rdev),
        "minor": os.minor(info.st_rdev),
        "mode": oct(stat.S_IMODE(info.st_mode)),
        "open_error": None,
    }
    if try_open and entry["char"]:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError as exc:
            entry["open_error"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return entry


def scan(dev_root: str, try_open: bool) -> dict[str, object]:
    devices: dict[str, dict[str, object]] = {}
    gpus: list[tuple[int, str]] = []
    caps: list[str] = []
    names = sorted(os.listdir(dev_root)) if os.path.isdir(dev_root) else []
    for name in names:
        match = GPU_NODE.match(name)
        if not (match or name in NAMED):
            continue
        entry = describe(os.path.join(dev_root, name), try_open)
        if entry is None:
            continue
        devices[f"/dev/{name}"] = entry
        # Only a character device is a GPU node (Proxmox refuses anything else as devN); the rest
        # stays in ``devices`` with char false, so the caller can name it.
        if match and entry["char"]:
            gpus.append((int(match.group(1)), f"/dev/{name}"))
    caps_dir = os.path.join(dev_root, "nvidia-caps")
    if os.path.isdir(caps_dir):
        for name in sorted(os.listdir(caps_dir)):
            entry = describe(os.path.join(caps_dir, name), try_open)
            if entry is not None:
                devices[f"/dev/nvidia-caps/{name}"] = entry
                if entry["char"]:
                    caps.append(f"/dev/nvidia-caps/{name}")
    return {
        "devices": devices,
        "gpus": [path for _minor, path in sorted(gpus)],
        "caps": caps,
        "proc_devices": proc_devices(),
    }
