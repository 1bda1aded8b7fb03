"""The PCIe fabric facts (issue #35, first part): the H200's own recording read back and checked
against nvidia-smi's texts recorded beside it; a switch topology and hostile config spaces built
byte by byte after the PCIe Base Specification's layouts."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from gpunode.ansible_collections.gpunode.core.plugins.module_utils import pci_fabric
from fakes.fabric import GPU_RESOURCE, REQ_REDIR_CMPLT, config_space, device

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "host" / "h200" / "fabric" / "fabric-sysroot.tar.gz"


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("h200-fabric")
    with tarfile.open(RECORDING) as tar:
        tar.extractall(folder, filter="data")
    return folder


def test_the_h200_recording_reads_as_nvidia_smi_says(h200: Path) -> None:
    facts = pci_fabric.gather(str(h200 / "sysroot"))
    smi = (h200 / "nvidia-smi-q.txt").read_text()
    [gpu] = facts["gpus"]
    # The bus id and BAR1 as nvidia-smi reports them, read independently from sysfs.
    assert re.search(r"^GPU 0000(\S+)$", smi, re.M).group(1).lower() == gpu["address"]
    bar1_mib = int(re.search(r"BAR1 Memory Usage\s+Total\s+:\s+(\d+) MiB", smi).group(1))
    assert gpu["bar1_bytes"] == bar1_mib * 2**20 == 256 * 2**30
    assert gpu["link"]["current_link_width"] == re.search(r"Link Width\s+Max\s+:\s+\d+x\s+Current\s+:\s+(\d+)x",
                                                          smi).group(1)
    # A VM's H200: an endpoint straight on the root bus, no bridge above it, no ACS of its own.
    assert gpu["port_type"] == "endpoint" and gpu["parents"] == [] and gpu["acs"] is None
    assert gpu["config_bytes"] == 4096  # recorded as root: the extended config space is there
    assert facts["driver_params"]["RegistryDwords"] == "" and facts["registry_dwords"] == {}
    assert facts["link_power"] == {"pcie_aspm": None, "pcie_port_pm": None}


# -- config spaces made after the PCIe Base Specification (tests/fakes/fabric.py) --------------
def test_a_switch_topology_with_acs_on_its_downstream_port(tmp_path: Path) -> None:
    top = "/sys/devices/pci0000:00/0000:00:01.0"
    device(tmp_path, top, config_space(0x4, 0))  # root port, ACS off
    device(tmp_path, f"{top}/0000:01:00.0", config_space(0x5))  # switch upstream port
    device(tmp_path, f"{top}/0000:01:00.0/0000:02:08.0", config_space(0x6, REQ_REDIR_CMPLT))
    device(tmp_path, f"{top}/0000:01:00.0/0000:02:08.0/0000:03:00.0", config_space(0x0), klass="0x030200",
           resource=GPU_RESOURCE)
    [gpu] = pci_fabric.gather(str(tmp_path))["gpus"]
    assert gpu["address"] == "0000:03:00.0" and gpu["bar1_bytes"] == 128 * 2**30
    assert [(p["address"], p["port_type"]) for p in gpu["parents"]] == [
        ("0000:00:01.0", "root port"), ("0000:01:00.0", "switch upstream port"),
        ("0000:02:08.0", "switch downstream port")]
    root_port, upstream, downstream = gpu["parents"]
    assert root_port["acs"] == dict.fromkeys(pci_fabric.ACS_BITS, False)
    assert upstream["acs"] is None  # no ACS capability on it
    assert [name for name, on in downstream["acs"].items() if on] == ["SrcValid", "ReqRedir", "CmpltRedir"]


def test_hostile_or_short_config_spaces_end_the_walk(tmp_path: Path) -> None:
    looped = bytearray(config_space(0x6, REQ_REDIR_CMPLT))
    looped[0x41] = 0x40  # the capability list points at itself
    looped[0x140:0x144] = (0x0001 | 0x140 << 20).to_bytes(4, "little")  # so does the extended list
    assert pci_fabric.port_type(bytes(looped)) == "switch downstream port"
    assert pci_fabric.acs_control(bytes(looped)) is None
    # Read without root: 64 bytes, no capability list to speak of, no extended space.
    assert pci_fabric.port_type(config_space(0x6, REQ_REDIR_CMPLT)[:64]) is None
    assert pci_fabric.acs_control(config_space(0x6, REQ_REDIR_CMPLT)[:256]) is None
    assert pci_fabric.acs_control(b"") is None and pci_fabric.port_type(b"\xff" * 4096) is None
    backwards = bytearray(config_space(None, 0))
    backwards[0x100:0x104] = (0x0001 | 0x080 << 20).to_bytes(4, "little")  # next below 0x100
    assert pci_fabric.acs_control(bytes(backwards)) is None


def test_registry_keys_link_power_and_resource_files() -> None:
    keys = "ForceP2P=0x11;RMForceP2PType=1;RMPcieP2PType=2;GrdmaPciTopoCheckOverride=1;EnableResizableBar=1"
    assert pci_fabric.registry_dwords(keys) == {"ForceP2P": "0x11", "RMForceP2PType": "1", "RMPcieP2PType": "2",
                                                "GrdmaPciTopoCheckOverride": "1", "EnableResizableBar": "1"}
    assert pci_fabric.registry_dwords("") == {} and pci_fabric.registry_dwords(";=1;x") == {}
    assert pci_fabric.link_power("ro quiet pcie_aspm=force pcie_aspm=off pcie_port_pm=off") == {
        "pcie_aspm": "off", "pcie_port_pm": "off"}
    assert pci_fabric.resource_sizes("0x0 0x0 0x0\nnot a line\n0x1000 0x1fff 0x200") == [0, 0, 4096]
    assert pci_fabric.bar1_bytes(GPU_RESOURCE) == 128 * 2**30
    assert pci_fabric.bar1_bytes("0xf0000000 0xf0ffffff 0x200\n") is None  # one region only
