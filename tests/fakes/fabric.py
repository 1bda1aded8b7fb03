"""PCIe fabrics built as sysfs trees, byte by byte after the PCIe Base Specification's layouts, for
module_utils/pci_fabric.py and the host stage's fabric findings: a function's config space (its
PCI Express capability and ACS), a device folder with the files sysfs has, and two topologies of
two GPUs each: under one PCIe switch, and direct-attached on two root ports.

Built, not recorded: the H200 machine the device tool lends is a VM with one GPU on the root bus
(tests/fixtures/host/h200/fabric), which has no bridge to carry ACS.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_PORT, SWITCH_UP, SWITCH_DOWN, ENDPOINT = 0x4, 0x5, 0x6, 0x0
REQ_REDIR_CMPLT = 0b0001101  # SrcValid+ ReqRedir+ CmpltRedir+: what firmware leaves on, per lspci
ACS_OFF = 0


def config_space(port: int | None, acs: int | None = None, size: int = 4096, acs_at: int = 0x140) -> bytes:
    """A function's config space: the PCI Express capability at 0x40 with device/port type
    ``port`` (7.5.3.2), a placeholder extended capability at 0x100 (ID 0, as the H200 has), then
    ACS at ``acs_at`` with control register ``acs`` (7.7.8)."""
    data = bytearray(size)
    data[0:2] = (0x10DE).to_bytes(2, "little")
    if port is not None:
        data[0x06] = 0x10  # Status: Capabilities List
        data[0x34] = 0x40
        data[0x40], data[0x41] = 0x10, 0x00
        data[0x42:0x44] = (0x0002 | port << 4).to_bytes(2, "little")
    if size > 0x100:
        data[0x100:0x104] = ((acs_at if acs is not None else 0) << 20).to_bytes(4, "little")
        if acs is not None:
            data[acs_at:acs_at + 4] = (0x000D | 1 << 16).to_bytes(4, "little")
            data[acs_at + 6:acs_at + 8] = acs.to_bytes(2, "little")
    return bytes(data)


def device(root: Path, path: str, config: bytes, vendor: str = "0x10de", klass: str = "0x060400",
           resource: str = "", driver: str | None = None) -> None:
    """A function's sysfs folder under root (config, vendor, class, resource; the driver link when
    given) and its /sys/bus/pci/devices link, relative as in a recording."""
    folder = root / path.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config").write_bytes(config)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "class").write_text(klass + "\n")
    (folder / "resource").write_text(resource)
    if driver:
        drivers = root / "sys" / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drivers, folder), folder / "driver")
    links = root / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(folder, links), links / folder.name)


def gpu_resource(bar1_bytes: int) -> str:
    """A GPU's sysfs resource file: BAR0 16 MiB, BAR1 (64-bit) of bar1_bytes, BAR3 32 MiB."""
    bar1 = 0x0000008000000000
    return ("0x00000000f0000000 0x00000000f0ffffff 0x0000000000040200\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
            f"0x{bar1:016x} 0x{bar1 + bar1_bytes - 1:016x} 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
            "0x00000000e0000000 0x00000000e1ffffff 0x000000000014220c\n")


GPU_RESOURCE = gpu_resource(128 * 2**30)  # an RTX PRO 6000's 96 GB behind a 128 GiB BAR1


def gpu(root: Path, parent: str, address: str, resource: str = GPU_RESOURCE) -> str:
    """A GPU (3D controller, bound to nvidia) at ``address`` below the bridge folder ``parent``."""
    device(root, f"{parent}/{address}", config_space(ENDPOINT), klass="0x030200", resource=resource, driver="nvidia")
    return address


def switch_pair(root: Path, acs: int = REQ_REDIR_CMPLT, bar1_bytes: int = 128 * 2**30) -> list[str]:
    """Two GPUs under one PCIe switch (PIX): a root port, the switch's upstream port, a downstream
    port per GPU with ACS control ``acs``. Returns the GPUs' addresses."""
    top = "/sys/devices/pci0000:00/0000:00:01.0"
    device(root, top, config_space(ROOT_PORT, ACS_OFF))
    device(root, f"{top}/0000:01:00.0", config_space(SWITCH_UP))
    gpus = []
    for down, bus in (("0000:02:08.0", "03"), ("0000:02:10.0", "04")):
        device(root, f"{top}/0000:01:00.0/{down}", config_space(SWITCH_DOWN, acs))
        gpus.append(gpu(root, f"{top}/0000:01:00.0/{down}", f"0000:{bus}:00.0", gpu_resource(bar1_bytes)))
    return gpus


def direct_pair(root: Path, acs: int = ACS_OFF) -> list[str]:
    """Two GPUs each on a root port of its own (NODE): no switch between them."""
    gpus = []
    for port, bus in (("0000:00:01.0", "01"), ("0000:00:03.0", "41")):
        top = f"/sys/devices/pci0000:00/{port}"
        device(root, top, config_space(ROOT_PORT, acs))
        gpus.append(gpu(root, top, f"0000:{bus}:00.0"))
    return gpus


def flat_switches(root: Path, switches: int = 3, per_switch: int = 2, acs: int = ACS_OFF) -> list[str]:
    """A flat fabric: ``switches`` PCIe switches, each on a root port of its own (no root switch
    above them), ``per_switch`` GPUs under each; the layout of rtx6kpro's 16-GPU TR Pro rig
    (hardware/collapse-report.md, lines 65-81) made smaller."""
    gpus = []
    for number in range(switches):
        top = f"/sys/devices/pci0000:00/0000:00:{number + 1:02x}.0"
        up = f"0000:{0x10 * (number + 1):02x}:00.0"
        device(root, top, config_space(ROOT_PORT, ACS_OFF))
        device(root, f"{top}/{up}", config_space(SWITCH_UP))
        for slot in range(per_switch):
            bus = 0x10 * (number + 1) + 1
            down = f"0000:{bus:02x}:{slot:02x}.0"
            device(root, f"{top}/{up}/{down}", config_space(SWITCH_DOWN, acs))
            gpus.append(gpu(root, f"{top}/{up}/{down}", f"0000:{bus + 1 + slot:02x}:00.0"))
    return gpus


def root_switch(root: Path, switches: int = 3, per_switch: int = 2) -> list[str]:
    """A hierarchical fabric: one root port, a root switch under it, ``switches`` switches under the
    root switch, ``per_switch`` GPUs under each: cross-switch traffic never reaches a CPU root port."""
    top = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    device(root, "/sys/devices/pci0000:00/0000:00:01.0", config_space(ROOT_PORT, ACS_OFF))
    device(root, top, config_space(SWITCH_UP))
    gpus = []
    for number in range(switches):
        base = 0x10 * (number + 1)
        down, up = f"{top}/0000:02:{number:02x}.0", f"0000:{base:02x}:00.0"
        device(root, down, config_space(SWITCH_DOWN, ACS_OFF))
        device(root, f"{down}/{up}", config_space(SWITCH_UP))
        for slot in range(per_switch):
            inner = f"{down}/{up}/0000:{base + 1:02x}:{slot:02x}.0"
            device(root, inner, config_space(SWITCH_DOWN, ACS_OFF))
            gpus.append(gpu(root, inner, f"0000:{base + 2 + slot:02x}:00.0"))
    return gpus
