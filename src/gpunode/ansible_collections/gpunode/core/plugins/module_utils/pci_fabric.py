"""Read-only facts of the PCIe fabric under each NVIDIA GPU, from files only, under a root prefix
(issue #35, first part: the facts; the findings and the verdict come next).

Per GPU: the chain of PCI functions from its root bus down to it (the sysfs path of the device),
each with its PCI Express port type and its ACS control bits (read from the config space file,
the way ``lspci -vvv`` decodes it), the GPU's BAR1 size (from sysfs ``resource``), and the link.
Beside them: the nvidia module's parameters that decide kernel-level P2P (``RegistryDwords``,
``GrdmaPciTopoCheckOverride``, ``EnableResizableBar`` in /proc/driver/nvidia/params) and the
kernel command line's link power settings.

Plain Python, so it runs as module_utils on the Proxmox host and on the machine that records the
fixtures. The config space is read from a file that may be damaged or hostile (a recording, a
sysfs file of a broken device): every walk is bounded and a loop in a capability list ends it.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Any

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS = "0x03"  # 0x0300 VGA, 0x0302 3D controller (the datacenter cards)
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")  # a PCI address, whole (\Z: no newline after)

# PCI Express capability (ID 0x10), Capabilities Register bits 7:4 (PCIe Base Spec 7.5.3.2).
PCIE_CAP_ID = 0x10
PORT_TYPES = {0x0: "endpoint", 0x1: "legacy endpoint", 0x4: "root port", 0x5: "switch upstream port",
              0x6: "switch downstream port", 0x7: "pcie-to-pci bridge", 0x8: "pci-to-pcie bridge",
              0x9: "root complex integrated endpoint", 0xA: "root complex event collector"}
# ACS extended capability (ID 0x000D), ACS Control Register at +6 (PCIe Base Spec 7.7.8.3), in
# the order and with the names lspci prints (ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...).
ACS_CAP_ID = 0x000D
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
EXT_START, CONFIG_MAX = 0x100, 4096
REDIRECT_BITS = ("ReqRedir", "CmpltRedir")  # what sends a peer's request or completion up to the root
SWITCH_DOWN, SWITCH_UP, ROOT_PORT = "switch downstream port", "switch upstream port", "root port"
LEGACY_BAR1 = 256 * 2**20  # the 32-bit window a card falls back to without Above 4G decoding
# The driver's keys for kernel-level P2P on direct-attached GPUs, as the RTX PRO 6000 community
# sets them (rtx6kpro optimization/pcie-oneshot-allreduce.md; FIELD-NOTES s13).
P2P_REGISTRY = {"ForceP2P": "0x11", "RMForceP2PType": "1", "RMPcieP2PType": "2", "GrdmaPciTopoCheckOverride": "1",
                "EnableResizableBar": "1"}
P2P_REGISTRY_DWORDS = ";".join(f"{key}={value}" for key, value in P2P_REGISTRY.items())


def _read(root: str, path: str, binary: bool = False) -> str | bytes | None:
    try:
        with open(os.path.join(root, path.lstrip("/")), "rb") as handle:
            data = handle.read(CONFIG_MAX + 1)
    except OSError:
        return None
    return data[:CONFIG_MAX] if binary else data.decode("utf-8", errors="replace").strip()


def _u16(data: bytes, offset: int) -> int | None:
    return int.from_bytes(data[offset:offset + 2], "little") if offset + 2 <= len(data) else None


def _u32(data: bytes, offset: int) -> int | None:
    return int.from_bytes(data[offset:offset + 4], "little") if offset + 4 <= len(data) else None


def capability(config: bytes, cap_id: int) -> int | None:
    """Offset of a standard capability in the config space (the list at 0x34), if it is there."""
    status = _u16(config, 0x06)
    if status is None or not status & 0x10 or len(config) < 0x40:  # Status: Capabilities List
        return None
    offset, seen = config[0x34] & 0xFC, set()
    while offset and offset not in seen and offset + 2 <= min(len(config), 0x100):
        seen.add(offset)
        if config[offset] == cap_id:
            return offset
        offset = config[offset + 1] & 0xFC
    return None


def extended_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of an extended capability (the list at 0x100; an ID of 0 is a placeholder whose next
    pointer still counts), if the config space holds it (only root reads past 256 bytes)."""
    offset, seen = EXT_START, set()
    while offset >= EXT_START and offset not in seen:
        header = _u32(config, offset)
        if header is None or header in (0, 0xFFFFFFFF):
            return None
        seen.add(offset)
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def port_type(config: bytes) -> str | None:
    """The PCI Express device/port type, or None for a function without the PCIe capability."""
    offset = capability(config, PCIE_CAP_ID)
    value = _u16(config, offset + 2) if offset is not None else None
    if value is None:
        return None
    return PORT_TYPES.get((value >> 4) & 0xF, f"type {(value >> 4) & 0xF}")


def acs_control(config: bytes) -> dict[str, bool] | None:
    """The ACS Control bits by lspci's names, or None when the function has no ACS capability
    (or the config space was read without root and ends at 256 bytes)."""
    offset = extended_capability(config, ACS_CAP_ID)
    value = _u16(config, offset + 6) if offset is not None else None
    if value is None:
        return None
    return {name: bool(value >> bit & 1) for bit, name in enumerate(ACS_BITS)}


def resource_sizes(text: str) -> list[int]:
    """Sizes in bytes of the regions in a sysfs ``resource`` file (one ``start end flags`` line per
    BAR, then the ROM); 0 for an unused one."""
    sizes = []
    for line in text.splitlines():
        parts = line.split()
        try:
            start, end = int(parts[0], 16), int(parts[1], 16)
        except (IndexError, ValueError):
            sizes.append(0)
            continue
        sizes.append(end - start + 1 if end > start else 0)
    return sizes


def bar1_bytes(text: str) -> int | None:
    """NVIDIA's BAR1 (the framebuffer aperture): the second memory region of BARs 0-5. A 64-bit
    BAR takes two registers, so it is counted by region, not by register index."""
    regions = [size for size in resource_sizes(text)[:6] if size]
    return regions[1] if len(regions) > 1 else None


def chain(sysfs_path: str) -> list[str]:
    """The PCI functions from the root bus down to the device, from its resolved sysfs path
    (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...)."""
    return [part for part in sysfs_path.split("/") if BDF.match(part)]


def _function(root: str, sysfs_dir: str) -> dict[str, object]:
    data = _read(root, f"{sysfs_dir}/config", binary=True)
    config = data if isinstance(data, bytes) else b""
    return {"port_type": port_type(config), "acs": acs_control(config), "config_bytes": len(config)}


def _sysfs_dir(root: str, bdf: str) -> str | None:
    """The resolved /sys/devices/... folder of a function, as the host sees it (a recording keeps
    the links relative, so they resolve inside ``root``)."""
    link = os.path.join(root, "sys/bus/pci/devices", bdf)
    try:
        real = os.path.realpath(link)
    except OSError:
        return None
    base = os.path.realpath(root)
    if base != os.sep and not real.startswith(base + os.sep):
        return None  # a link that leaves the recording
    return "/" + os.path.relpath(real, base)


def gpus(root: str) -> list[dict[str, object]]:
    """Per NVIDIA display function: its address, the chain up to it with each function's port type
    and ACS bits, its BAR1 size and its link."""
    out: list[dict[str, object]] = []
    try:
        names = sorted(os.listdir(os.path.join(root, "sys/bus/pci/devices")))
    except OSError:
        return out
    for bdf in (name for name in names if BDF.match(name)):
        base = f"/sys/bus/pci/devices/{bdf}"
        if _read(root, f"{base}/vendor") != NVIDIA_VENDOR:
            continue
        if not str(_read(root, f"{base}/class") or "").startswith(DISPLAY_CLASS):
            continue
        real = _sysfs_dir(root, bdf)
        if real is None:
            continue
        parts = real.split("/")
        dirs = ["/".join(parts[:index + 1]) for index, part in enumerate(parts) if BDF.match(part)]
        parents = [{"address": folder.rsplit("/", 1)[1], **_function(root, folder)} for folder in dirs[:-1]]
        resource = _read(root, f"{base}/resource")
        out.append({
            "address": bdf,
            "parents": parents,
            **_function(root, real),
            "bar1_bytes": bar1_bytes(str(resource)) if resource else None,
            "link": {key: _read(root, f"{base}/{key}") for key in
                     ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")},
            "numa_node": _read(root, f"{base}/numa_node"),
        })
    return out


def driver_params(root: str) -> dict[str, str]:
    """The nvidia module's P2P-related parameters in effect (/proc/driver/nvidia/params), quotes
    removed; absent when the module is not loaded."""
    text = str(_read(root, "/proc/driver/nvidia/params") or "")
    wanted = ("RegistryDwords", "RegistryDwordsPerDevice", "GrdmaPciTopoCheckOverride", "EnableResizableBar")
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in wanted:
            out[key.strip()] = value.strip().strip('"')
    return out


def registry_dwords(value: str) -> dict[str, str]:
    """``ForceP2P=0x11;RMForceP2PType=1`` as a dict; the driver splits at ';' and takes KEY=VALUE."""
    out = {}
    for part in value.split(";"):
        key, sep, val = part.partition("=")
        if sep and key.strip():
            out[key.strip()] = val.strip()
    return out


def _number(value: object) -> int | None:
    try:
        return int(str(value).strip(), 0)  # 0x11 and 17 are one value to the driver
    except ValueError:
        return None


def missing_p2p_keys(keys: dict[str, str]) -> list[str]:
    """The P2P keys (KEY=VALUE) that ``keys`` lacks or sets to another number."""
    return [f"{key}={value}" for key, value in P2P_REGISTRY.items()
            if key not in keys or _number(keys[key]) is None or _number(keys[key]) != _number(value)]


def live_p2p_keys(fabric: dict[str, object]) -> dict[str, str]:
    """The P2P keys in effect in the loaded module: its RegistryDwords, and the two that are module
    parameters of their own too (GrdmaPciTopoCheckOverride, EnableResizableBar) where those are set."""
    dwords = fabric.get("registry_dwords")
    params = fabric.get("driver_params")
    keys = {str(k): str(v) for k, v in dwords.items()} if isinstance(dwords, dict) else {}
    if isinstance(params, dict):
        for key in ("GrdmaPciTopoCheckOverride", "EnableResizableBar"):
            if key not in keys and _number(params.get(key)) not in (None, 0):
                keys[key] = str(params[key])
    return keys


def link_power(cmdline: str) -> dict[str, str | None]:
    """The kernel command line's PCIe link power settings (the last of each wins, as in the kernel)."""
    found: dict[str, str | None] = {"pcie_aspm": None, "pcie_port_pm": None}
    for word in cmdline.split():
        key, sep, value = word.partition("=")
        if key in found and sep:
            found[key] = value
    return found


def gather(root: str = "/") -> dict[str, object]:
    params = driver_params(root)
    return {
        "gpus": gpus(root),
        "driver_params": params,
        "registry_dwords": registry_dwords(params.get("RegistryDwords", "")),
        "link_power": link_power(str(_read(root, "/proc/cmdline") or "")),
    }


# -- the topology the facts describe (read by the host stage's findings and the p2p verdict) --------

def parents(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in gpu.get("parents") or [] if isinstance(p, dict)]


def _switches(chain: list[dict[str, Any]]) -> list[str]:
    """The PCIe switches above a function, top first: the addresses of the switch upstream ports in its chain."""
    return [p["address"] for p in chain if p.get("port_type") == SWITCH_UP]


def switches(gpu: dict[str, Any]) -> list[str]:
    """The PCIe switches above a GPU, top first."""
    return _switches(parents(gpu))


def shape_problem(fabric: Any) -> str | None:
    """What makes ``fabric`` something gather() never returns (so nothing can be judged from it),
    or None: a mapping, a ``gpus`` list of mappings each with a PCI address (what sysfs names; so
    an address shown in a message is inert) and a list of parents, ``driver_params`` and ``registry_dwords`` mappings where present."""
    if not isinstance(fabric, dict) or not isinstance(fabric.get("gpus"), list):
        return "not a mapping with a 'gpus' list"
    if not all(isinstance(fabric.get(key, {}), dict) for key in ("driver_params", "registry_dwords")):
        return "driver_params or registry_dwords is not a mapping"
    if not all(isinstance(gpu, dict) and BDF.match(str(gpu.get("address"))) and isinstance(gpu.get("parents", []), list)
               for gpu in fabric["gpus"]):
        return "a GPU without a PCI address or a parents list"
    return None


def direct_pairs(gpus: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of GPUs with no PCIe switch above both: their peer traffic crosses a root port or the CPU."""
    return [(str(one["address"]), str(other["address"])) for one, other in itertools.combinations(gpus, 2)
            if not set(switches(one)) & set(switches(other))]


def redirecting_bridges(gpus: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each bridge above a GPU whose ACS control redirects peer traffic: address -> {port_type, bits, gpus}."""
    out: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        for bridge in parents(gpu):
            acs = bridge.get("acs") or {}
            bits = [name for name in REDIRECT_BITS if acs.get(name)]
            if bits:
                entry = out.setdefault(bridge["address"], {"port_type": bridge.get("port_type"), "bits": bits,
                                                           "gpus": []})
                entry["gpus"].append(str(gpu["address"]))
    return out


def shared_switch_ports(gpus: list[dict[str, Any]]) -> dict[str, str]:
    """Each switch downstream port with an ACS capability above a GPU, whose own switch (the nearest
    upstream port above the port, at any depth) has two or more GPUs beneath it: port -> that switch.
    ACS there redirects traffic between GPUs of one switch. Read from the capability, not the bits,
    so the list stays the same once the bits are cleared."""
    beneath: dict[str, set[str]] = {}
    for gpu in gpus:
        for switch in switches(gpu):
            beneath.setdefault(switch, set()).add(str(gpu["address"]))
    out: dict[str, str] = {}
    for gpu in gpus:
        chain = parents(gpu)
        for index, bridge in enumerate(chain):
            if bridge.get("port_type") != SWITCH_DOWN or bridge.get("acs") is None:
                continue
            above = _switches(chain[:index])
            if above and len(beneath.get(above[-1], ())) > 1:
                out[bridge["address"]] = above[-1]
    return out
