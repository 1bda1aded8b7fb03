"""GPU topology and link state from NVML, read into plain dataclasses.

Everything here comes from NVML (nvidia-ml-py, imported as ``pynvml``) or from /proc and /sys; the
caller passes the initialised ``pynvml`` module in, so this file imports nothing heavy. A reading
NVML refuses (``Not Supported`` on a VM, an older driver) is kept as ``None`` with NVML's message in
``unavailable``: a missing number is reported as missing, never guessed.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# nvmlDeviceGetTopologyCommonAncestor levels and nvidia-smi's names for them (FIELD-NOTES s7).
# INTERNAL (two GPUs on one board) has no nvidia-smi letter; it is shown as INT.
TOPOLOGY_LEGEND: dict[int, str] = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
LEGEND_TEXT: dict[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g. QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
    "INT": "Both GPUs on one board (NVML INTERNAL)",
}

# nvmlDeviceGetP2PStatus: pass plain integers. nvidia-ml-py's NVML_P2P_CAPS_INDEX_READ is the
# tuple (0,) because of a stray comma in its source, and NVML would reject it.
P2P_CAPS: dict[str, int] = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
P2P_STATUS: dict[int, str] = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
VIRTUALIZATION_MODE: dict[int, str] = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}
# Clock event ("throttle") reason bits, as nvidia-smi -q names them.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NUMA_MASK_WORDS = 2  # 64-bit words of NUMA node mask: up to 128 nodes
NVLINK_MAX_LINKS = 18  # Hopper and Blackwell have at most 18 links per GPU
NVLINK_REMOTE_GPU, NVLINK_REMOTE_SWITCH = 0, 2
PCIE_GBPS_PER_LANE: dict[int, float] = {  # decimal GB/s per lane per direction, after line encoding
    1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563,
}


@dataclass
class PcieLink:
    """PCIe generation and width. Idle values are read before any copy; links drop at idle."""

    max_gen: int | None = None  # what this GPU and its slot can do together
    max_width: int | None = None
    gpu_max_gen: int | None = None  # what the GPU alone can do
    idle_gen: int | None = None
    idle_width: int | None = None


@dataclass
class LoadReading:
    """Readings taken while host-to-device copies were running on the GPU."""

    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_rx_mbps: float | None = None  # NVML's PCIe counter over ~20 ms, proves the link was busy
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    clock_event_reasons: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Gpu:
    """One GPU as NVML sees it; ``index`` is NVML's index, not a CUDA ordinal."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int | None = None
    numa_node: int | None = None  # NVML's NUMA node id of the GPU (N/A in many VMs)
    numa_affinity: list[int] = field(default_factory=list)  # nearest memory nodes: nvidia-smi's 'NUMA Affinity'
    cpu_affinity: list[int] = field(default_factory=list)
    virtualization_mode: int | None = None
    virtualization: str | None = None
    pcie: PcieLink = field(default_factory=PcieLink)
    power_limit_w: float | None = None
    enforced_power_limit_w: float | None = None
    idle_clocks_mhz: dict[str, int | None] = field(default_factory=dict)
    max_clocks_mhz: dict[str, int | None] = field(default_factory=dict)
    idle_clock_event_reasons: list[str] = field(default_factory=list)
    nvlinks_active: int = 0
    nvlinks_to_switch: int = 0
    under_load: LoadReading | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class PairTopology:
    """One ordered pair of GPUs (NVML indices): path, NVLinks and NVML's P2P status per capability."""

    src: int
    dst: int
    level: int | None
    legend: str  # nvidia-smi's short name: PIX, PXB, PHB, NODE, SYS, NV#
    nvlinks: int = 0
    p2p_status: dict[str, int | None] = field(default_factory=dict)
    p2p_reason: dict[str, str] = field(default_factory=dict)  # capability -> status name, OK included

    def p2p_ok(self, capability: str) -> bool:
        return self.p2p_status.get(capability) == 0


@dataclass
class HostFacts:
    """What the operating system says about where this runs (a container shares the host's kernel)."""

    kernel: str = ""
    cpu_count: int = 0
    allowed_cpus: list[int] = field(default_factory=list)
    hypervisor_cpu_flag: bool = False  # /proc/cpuinfo 'hypervisor': a VM's CPU
    container: str | None = None  # /run/systemd/container, e.g. lxc, docker
    uvm_disable_hmm: str | None = None  # Y / N; None when nvidia_uvm is not loaded
    nvidia_uvm_loaded: bool = False
    dev_nvidia_uvm: bool = False
    iommu_cmdline: list[str] = field(default_factory=list)  # iommu-related kernel command line words
    iommu_groups: int | None = None


@dataclass
class Topology:
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    gpus: list[Gpu]
    pairs: list[PairTopology]
    host: HostFacts

    def gpu(self, index: int) -> Gpu:
        return next(gpu for gpu in self.gpus if gpu.index == index)

    def pair(self, src: int, dst: int) -> PairTopology | None:
        return next((p for p in self.pairs if p.src == src and p.dst == dst), None)


def nvml_text(value: Any) -> str:
    """An NVML string as text (the binding answers bytes or str, by version)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Reader:
    """Calls NVML, keeping each refusal's message under the reading's name instead of raising."""

    def __init__(self, nvml: Any, unavailable: dict[str, str]) -> None:
        self.nvml = nvml
        self.unavailable = unavailable

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.unavailable[name] = str(exc)
            return None


def cpus_from_mask(words: Any, bits_per_word: int = 64) -> list[int]:
    """Numbers (CPUs or NUMA nodes) set in an NVML affinity mask: 64-bit words, lowest first."""
    cpus: list[int] = []
    for word_index, word in enumerate(words):
        value = int(word)
        for bit in range(bits_per_word):
            if value >> bit & 1:
                cpus.append(word_index * bits_per_word + bit)
    return cpus


def reason_names(mask: int | None) -> list[str]:
    if mask is None:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([f"other_0x{unknown:x}"] if unknown else [])


def clock_event_reasons(nvml: Any, handle: Any, read: Reader) -> int | None:
    # 'ClocksEvent' replaced 'ClocksThrottle' in newer drivers; an older libnvidia-ml lacks it.
    newer = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if newer is not None:
        try:
            return int(newer(handle))
        except nvml.NVMLError:
            pass
    return read("clock_event_reasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)


def _clocks(nvml: Any, handle: Any, read: Reader, getter: Callable[..., int], prefix: str) -> dict[str, int | None]:
    kinds = {"graphics": nvml.NVML_CLOCK_GRAPHICS, "sm": nvml.NVML_CLOCK_SM, "mem": nvml.NVML_CLOCK_MEM}
    return {name: read(f"{prefix}_{name}", getter, handle, kind) for name, kind in kinds.items()}


def _milliwatts_to_watts(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def read_gpu(nvml: Any, index: int, handle: Any) -> Gpu:
    unavailable: dict[str, str] = {}
    read = Reader(nvml, unavailable)
    pci = read("pci_info", nvml.nvmlDeviceGetPciInfo, handle)
    memory = read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    words = ((os.cpu_count() or 1) + 63) // 64 + 1  # one spare word: NVML refuses a mask too small
    mask = read("cpu_affinity", nvml.nvmlDeviceGetCpuAffinity, handle, words)
    mode = read("virtualization_mode", nvml.nvmlDeviceGetVirtualizationMode, handle)
    numa = read("numa_node", nvml.nvmlDeviceGetNumaNodeId, handle)
    node_mask = read("numa_affinity", nvml.nvmlDeviceGetMemoryAffinity, handle, NUMA_MASK_WORDS,
                     getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
    gpu = Gpu(
        index=index,
        name=nvml_text(nvml.nvmlDeviceGetName(handle)),
        uuid=nvml_text(nvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=nvml_text(pci.busId) if pci is not None else "",
        memory_total_mib=None if memory is None else int(memory.total) // 2**20,
        numa_node=numa if numa is None or numa >= 0 else None,  # -1: the platform reports none
        numa_affinity=cpus_from_mask(node_mask) if node_mask is not None else [],
        cpu_affinity=cpus_from_mask(mask) if mask is not None else [],
        virtualization_mode=mode,
        virtualization=VIRTUALIZATION_MODE.get(mode, f"unknown({mode})") if mode is not None else None,
        pcie=PcieLink(
            max_gen=read("pcie_max_gen", nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            max_width=read("pcie_max_width", nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
            gpu_max_gen=read("pcie_gpu_max_gen", nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
            idle_gen=read("pcie_idle_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            idle_width=read("pcie_idle_width", nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        ),
        power_limit_w=_milliwatts_to_watts(read("power_limit", nvml.nvmlDeviceGetPowerManagementLimit, handle)),
        enforced_power_limit_w=_milliwatts_to_watts(
            read("enforced_power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        idle_clocks_mhz=_clocks(nvml, handle, read, nvml.nvmlDeviceGetClockInfo, "clock"),
        max_clocks_mhz=_clocks(nvml, handle, read, nvml.nvmlDeviceGetMaxClockInfo, "max_clock"),
        idle_clock_event_reasons=reason_names(clock_event_reasons(nvml, handle, read)),
        unavailable=unavailable,
    )
    return gpu


def read_under_load(nvml: Any, handle: Any) -> LoadReading:
    """Link, clocks and power while copies run. Call it with copies in flight on this GPU."""
    unavailable: dict[str, str] = {}
    read = Reader(nvml, unavailable)
    rx_kbps = read("pcie_rx", nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
    power = read("power_usage", nvml.nvmlDeviceGetPowerUsage, handle)
    return LoadReading(
        pcie_gen=read("pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=read("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        pcie_rx_mbps=None if rx_kbps is None else rx_kbps / 1000.0,
        sm_clock_mhz=read("sm_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        mem_clock_mhz=read("mem_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        power_w=_milliwatts_to_watts(power),
        clock_event_reasons=reason_names(clock_event_reasons(nvml, handle, read)),
        unavailable=unavailable,
    )


def _nvlink_remotes(nvml: Any, handle: Any) -> list[tuple[int, str]]:
    """(remote device type, remote PCI bus id) for each active NVLink of one GPU."""
    remotes: list[tuple[int, str]] = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != 1:
                continue
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except nvml.NVMLError:
            # NOT_SUPPORTED on link 0 means the GPU has no NVLink; later links past the count
            # answer INVALID_ARGUMENT. Neither is an error for this check.
            if link == 0:
                break
            continue
        remotes.append((int(kind), nvml_text(remote.busId).lower()))
    return remotes


def _nvlink_counts(nvml: Any, handles: list[Any], gpus: list[Gpu]) -> dict[tuple[int, int], int]:
    """NVLinks between each pair: direct GPU-to-GPU links, or through NVSwitches (nvidia-smi's NV#)."""
    by_bus = {gpu.pci_bus_id.lower(): gpu.index for gpu in gpus}
    direct: dict[tuple[int, int], int] = {}
    for gpu, handle in zip(gpus, handles, strict=True):
        for kind, bus in _nvlink_remotes(nvml, handle):
            gpu.nvlinks_active += 1
            if kind == NVLINK_REMOTE_SWITCH:
                gpu.nvlinks_to_switch += 1
            elif kind == NVLINK_REMOTE_GPU and bus in by_bus:
                key = (gpu.index, by_bus[bus])
                direct[key] = direct.get(key, 0) + 1
    counts: dict[tuple[int, int], int] = {}
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            through_switch = min(a.nvlinks_to_switch, b.nvlinks_to_switch)
            counts[(a.index, b.index)] = direct.get((a.index, b.index), 0) or through_switch
    return counts


def read_pair(nvml: Any, src: Gpu, dst: Gpu, src_handle: Any, dst_handle: Any, nvlinks: int) -> PairTopology:
    level: int | None
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(src_handle, dst_handle))
    except nvml.NVMLError:
        level = None
    status: dict[str, int | None] = {}
    reason: dict[str, str] = {}
    for capability, index in P2P_CAPS.items():
        try:
            code = int(nvml.nvmlDeviceGetP2PStatus(src_handle, dst_handle, index))
            status[capability] = code
            reason[capability] = P2P_STATUS.get(code, f"UNKNOWN({code})")
        except nvml.NVMLError as exc:
            status[capability] = None
            reason[capability] = f"NVML: {exc}"
    legend = f"NV{nvlinks}" if nvlinks else TOPOLOGY_LEGEND.get(level, "?") if level is not None else "?"
    return PairTopology(src=src.index, dst=dst.index, level=level, legend=legend, nvlinks=nvlinks,
                        p2p_status=status, p2p_reason=reason)


def _read_file(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def read_host_facts() -> HostFacts:
    cpuinfo = _read_file("/proc/cpuinfo") or ""
    cmdline = (_read_file("/proc/cmdline") or "").split()
    groups = Path("/sys/kernel/iommu_groups")
    return HostFacts(
        kernel=platform.release(),
        cpu_count=os.cpu_count() or 0,
        allowed_cpus=sorted(os.sched_getaffinity(0)),
        hypervisor_cpu_flag=any(line.startswith("flags") and " hypervisor" in line for line in cpuinfo.splitlines()),
        container=_read_file("/run/systemd/container") or os.environ.get("container") or None,  # noqa: SIM112
        uvm_disable_hmm=_read_file("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"),
        nvidia_uvm_loaded=Path("/sys/module/nvidia_uvm").exists(),
        dev_nvidia_uvm=Path("/dev/nvidia-uvm").exists(),
        iommu_cmdline=[word for word in cmdline if "iommu" in word or "acs" in word],
        iommu_groups=len(list(groups.iterdir())) if groups.is_dir() else None,
    )


def _system_string(nvml: Any, name: str) -> str | None:
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        value = fn()
    except nvml.NVMLError:
        return None
    if isinstance(value, int):  # CUDA driver version comes as e.g. 13000
        return f"{value // 1000}.{value % 1000 // 10}"
    return nvml_text(value)


def device_handles(nvml: Any) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]


def read_topology(nvml: Any, handles: list[Any]) -> Topology:
    """Every GPU, every ordered pair, and the host facts. ``nvml`` must be initialised."""
    gpus = [read_gpu(nvml, index, handle) for index, handle in enumerate(handles)]
    nvlinks = _nvlink_counts(nvml, handles, gpus)
    pairs = [
        read_pair(nvml, src, dst, handles[src.index], handles[dst.index], nvlinks[(src.index, dst.index)])
        for src in gpus for dst in gpus if src.index != dst.index
    ]
    return Topology(
        driver_version=_system_string(nvml, "nvmlSystemGetDriverVersion"),
        cuda_driver_version=_system_string(nvml, "nvmlSystemGetCudaDriverVersion"),
        nvml_version=_system_string(nvml, "nvmlSystemGetNVMLVersion"),
        gpus=gpus,
        pairs=pairs,
        host=read_host_facts(),
    )


def link_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth, decimal GB/s (Gen5 x16: 63)."""
    if gen is None or width is None or gen not in PCIE_GBPS_PER_LANE:
        return None
    return PCIE_GBPS_PER_LANE[gen] * width
