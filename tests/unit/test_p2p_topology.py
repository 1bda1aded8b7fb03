"""NVML reading helpers, driven by the recorded H200 readings (tests/fixtures/p2p/p2p.json).

``RecordedNvml`` answers NVML calls with the values recorded on the real GPU, and raises NVML's
error where the real NVML refused (NUMA id: Not Supported), so ``read_topology`` is checked
against what the real NVML said.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpunode.stages.p2p import measure, report, topology

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "tests" / "fixtures" / "p2p" / "p2p.json").read_text())
GPU = RECORDED["topology"]["gpus"][0]


def mask(numbers: list[int], words: int) -> list[int]:
    out = [0] * words
    for number in numbers:
        out[number // 64] |= 1 << number % 64
    return out


class RecordedNvml:
    """The NVML calls read_topology makes, answered from the recording."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_AFFINITY_SCOPE_NODE = 0

    def __init__(self) -> None:
        self.p2p_indices: list[Any] = []

    def _refused(self, name: str) -> pynvml.NVMLError:
        assert GPU["unavailable"][name] == "Not Supported"
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return GPU["name"].encode()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(GPU["uuid"])

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=GPU["pci_bus_id"].encode())

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=GPU["memory_total_mib"] * 2**20)

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        return mask(GPU["cpu_affinity"], words)

    def nvmlDeviceGetMemoryAffinity(self, handle: int, words: int, scope: int) -> list[int]:
        return mask(GPU["numa_affinity"], words)

    def nvmlDeviceGetVirtualizationMode(self, handle: int) -> int:
        return int(GPU["virtualization_mode"])

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        raise self._refused("numa_node")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(GPU["pcie"]["max_gen"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return int(GPU["pcie"]["max_width"])

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(GPU["pcie"]["gpu_max_gen"])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return int(GPU["pcie"]["idle_gen"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return int(GPU["pcie"]["idle_width"])

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        return int(GPU["power_limit_w"] * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return int(GPU["enforced_power_limit_w"] * 1000)

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        return int(GPU["idle_clocks_mhz"][["graphics", "sm", "mem"][kind]])

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        return int(GPU["max_clocks_mhz"][["graphics", "sm", "mem"][kind]])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return 0x1  # gpu_idle, as recorded at idle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return 0x1

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # recorded: 0 active NVLinks

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        raise AssertionError("one GPU: no pair to ask about")

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        self.p2p_indices.append(index)
        return 0

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(RECORDED["topology"]["driver_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(RECORDED["topology"]["nvml_version"])


def test_read_topology_assembles_the_recorded_readings() -> None:
    nvml = RecordedNvml()
    read = topology.read_topology(nvml, topology.device_handles(nvml))
    (gpu,) = read.gpus
    recorded = report.result_from_json(RECORDED).topology
    assert recorded is not None
    expected = recorded.gpus[0]
    expected.under_load = None  # read later, while copies run
    assert gpu == expected
    assert read.pairs == [] and read.driver_version == recorded.driver_version
    assert read.cuda_driver_version == recorded.cuda_driver_version == "13.0"


class TwoGpuNvml(RecordedNvml):
    """A derived pair (no multi-GPU recording exists): NODE level, P2P OK from the FIELD-NOTES enum."""

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 40


def test_p2p_status_is_asked_with_plain_integers() -> None:
    # nvidia-ml-py's NVML_P2P_CAPS_INDEX_READ is the tuple (0,) by a stray comma: never pass it.
    assert pynvml.NVML_P2P_CAPS_INDEX_READ == (0,)
    assert topology.P2P_CAPS == {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
    nvml = TwoGpuNvml()
    a = topology.Gpu(index=0, name="", uuid="", pci_bus_id="")
    b = topology.Gpu(index=1, name="", uuid="", pci_bus_id="")
    pair = topology.read_pair(nvml, a, b, 0, 1, nvlinks=0)
    assert nvml.p2p_indices == [0, 1, 2, 3, 4] and all(type(i) is int for i in nvml.p2p_indices)
    assert (pair.legend, pair.p2p_reason["read"]) == ("NODE", "OK")


def test_nvml_levels_and_status_names_follow_field_notes() -> None:
    assert topology.TOPOLOGY_LEGEND == {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
    assert [topology.P2P_STATUS[i] for i in range(6)] == [
        "OK", "CHIPSET_NOT_SUPPORTED", "GPU_NOT_SUPPORTED", "IOH_TOPOLOGY_NOT_SUPPORTED", "DISABLED_BY_REGKEY",
        "NOT_SUPPORTED"]


def test_affinity_masks_and_cpu_ranges() -> None:
    assert topology.cpus_from_mask(mask(GPU["cpu_affinity"], 2)) == GPU["cpu_affinity"] == list(range(16))
    assert topology.cpus_from_mask([0, 1]) == [64]
    assert report.cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert report.cpu_ranges([]) == "N/A"


def test_clock_event_reason_names() -> None:
    assert topology.reason_names(0x1) == ["gpu_idle"] == GPU["idle_clock_event_reasons"]
    assert topology.reason_names(0) == [] and topology.reason_names(None) == []
    assert topology.reason_names(0x8 | 0x40 | 0x10000) == ["hw_slowdown", "hw_thermal_slowdown", "other_0x10000"]


def test_pcie_link_bandwidth() -> None:
    assert topology.link_gbps(5, 16) == pytest.approx(63.0, abs=0.1)  # FIELD-NOTES: Gen5 x16, 63 GB/s a direction
    assert topology.link_gbps(None, 16) is None


class FakeProps:
    def __init__(self, uuid: str, bus: str) -> None:
        domain, bus_number, device = bus.split(":")[0], bus.split(":")[1], bus.split(":")[2].split(".")[0]
        self.uuid = uuid
        self.pci_domain_id, self.pci_bus_id, self.pci_device_id = int(domain, 16), int(bus_number, 16), int(device, 16)


class FakeTorch:
    """CUDA lists devices in its own order (fastest first by default): here NVML's reversed."""

    def __init__(self, props: list[FakeProps]) -> None:
        self.props = props
        self.cuda = SimpleNamespace(device_count=lambda: len(props), get_device_properties=lambda i: props[i])


def test_nvml_gpus_are_matched_to_cuda_devices_by_uuid_then_bus_id() -> None:
    uuid, bus = GPU["uuid"], GPU["pci_bus_id"]  # recorded; the second GPU is derived from it
    other_uuid, other_bus = uuid[:-1] + "0", "00000000:41:00.0"
    nvml_gpus = [(0, uuid, bus), (1, other_uuid, other_bus)]
    # torch prints the UUID without NVML's 'GPU-' prefix
    torch = FakeTorch([FakeProps(other_uuid.removeprefix("GPU-"), other_bus), FakeProps(uuid[4:], bus)])
    assert measure.cuda_ordinals(torch, nvml_gpus) == {1: 0, 0: 1}
    no_uuid = FakeTorch([FakeProps("", other_bus), FakeProps("", bus)])
    assert measure.cuda_ordinals(no_uuid, nvml_gpus) == {1: 0, 0: 1}
    assert measure.cuda_bus_id(FakeProps("", bus)) == bus.lower()
