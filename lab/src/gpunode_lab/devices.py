"""Fake GPU device nodes: char nodes with NVIDIA's majors and no driver behind them (ENXIO on open)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gpunode_lab.contract import (
    DEV_DIR, LAB_GPU_COUNT, LabError, NVIDIA_MAJOR, Progress, UVM_MAJOR_FILE, UVM_MAJOR_RANGE,
)
from gpunode_lab.util import write_if_changed
from gpunode.ground.nvidia import MINORS, UVM_NODES

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
    # The control nodes with the driver's own numbers (gpunode.ground.nvidia), nvidia-uvm's on its free major.
    nodes.update({path[len("/dev/"):]: (major_uvm if path in UVM_NODES else NVIDIA_MAJOR, minor)
                  for path, minor in MINORS.items()})
    return nodes


def ensure_devices(progress: Progress) -> tuple[bool, int]:
    changed = False
    DEV_DIR.mkdir(parents=True, exist_ok=True)
    uvm = uvm_major()
    changed |= write_if_changed(UVM_MAJOR_FILE, f"{uvm}\n", 0o644)
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
