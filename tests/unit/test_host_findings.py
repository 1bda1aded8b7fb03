"""Host preflight findings, driven by facts recorded on a real GPU machine (H200, driver 580)."""

from __future__ import annotations

import copy
import importlib.util
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.host import vfio
from gpunode.stages.host.findings import Expectations, evaluate
from gpunode.ground.paths import MODULE_UTILS
from gpunode_lab.contract import HOST_FACTS_TARBALL  # the recording the lab ships

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "host" / "h200"


@pytest.fixture
def facts() -> dict[str, Any]:
    return json.loads((RECORDED / "host-facts.json").read_text())


def by_name(findings: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for finding in findings:
        out.setdefault(finding.code, finding)
    return out


def test_recorded_machine_is_what_we_think(facts: dict[str, Any]) -> None:
    assert facts["driver"] == {"banner": facts["driver"]["banner"], "loaded": True, "open": True, "version": "580.159.04"}
    assert "Open Kernel Module" in facts["driver"]["banner"]
    assert facts["uvm"]["uvm_disable_hmm"] == "N"
    assert [g["driver"] for g in facts["gpus"]] == ["nvidia"]


def test_findings_on_the_recorded_h200(facts: dict[str, Any]) -> None:
    found = by_name(evaluate(facts, Expectations(driver_version="580.159.04")))
    assert found["driver"].severity == "ok" and found["open_module"].severity == "ok"
    assert found["gpu_binding"].severity == "ok"
    assert found["gpus"].message.startswith("1 NVIDIA GPU(s): 0000:00:06.0 (0x2335, driver nvidia)")
    # HMM is on there: the stage fixes it (not blocking) and says how.
    assert found["hmm"].severity == "fail" and not found["hmm"].blocking
    assert "uvm_disable_hmm=1" in found["hmm"].fix and "error 3" in found["hmm"].message
    assert found["iommu"].severity == "ok"
    assert found["device_nodes"].severity == "ok"
    assert found["os"].severity == "warn" and "pve-manager not installed" in found["os"].message
    assert not any(f.blocking for f in evaluate(facts, Expectations(driver_version="580.159.04")))


def test_version_mismatch_blocks_without_installer(facts: dict[str, Any]) -> None:
    pinned = evaluate(facts, Expectations(driver_version="580.95.05"))
    driver = by_name(pinned)["driver"]
    assert driver.severity == "fail" and driver.blocking and "580.159.04 loaded, host file pins 580.95.05" in driver.message
    with_installer = by_name(evaluate(facts, Expectations(driver_version="580.95.05", installer=True)))["driver"]
    assert not with_installer.blocking


def test_vfio_bound_gpu(facts: dict[str, Any]) -> None:
    changed = copy.deepcopy(facts)
    changed["gpus"][0]["driver"] = "vfio-pci"
    binding = by_name(evaluate(changed, Expectations(driver_version="580.159.04")))["gpu_binding"]
    assert binding.severity == "fail" and not binding.blocking and "reboot" in binding.fix
    refused = by_name(evaluate(changed, Expectations(driver_version="580.159.04", release_vfio=False)))["gpu_binding"]
    assert refused.blocking


def test_proprietary_module_blocks(facts: dict[str, Any]) -> None:
    changed = copy.deepcopy(facts)
    changed["driver"]["open"] = False
    found = by_name(evaluate(changed, Expectations(driver_version="580.159.04")))["open_module"]
    assert found.blocking and "--kernel-module-type=open" in found.fix


def test_no_driver_and_no_uvm(facts: dict[str, Any]) -> None:
    changed = copy.deepcopy(facts)
    changed["driver"] = {"loaded": False, "version": None, "open": False, "banner": None}
    changed["uvm"] = {"loaded": False, "uvm_disable_hmm": None}
    changed["devices"]["devices"].pop("/dev/nvidia-uvm")
    found = by_name(evaluate(changed, Expectations(driver_version="580.159.04")))
    assert found["driver"].blocking and "driver.installer" in found["driver"].fix
    assert found["hmm"].severity == "warn"
    assert found["device_nodes"].severity == "fail" and "/dev/nvidia-uvm" in found["device_nodes"].message


def test_translated_iommu_warns(facts: dict[str, Any]) -> None:
    changed = copy.deepcopy(facts)
    changed["kernel"]["intel_iommu"] = "on"
    assert by_name(evaluate(changed, Expectations(driver_version="580.159.04")))["iommu"].severity == "warn"
    changed["kernel"]["iommu"] = "pt"
    assert by_name(evaluate(changed, Expectations(driver_version="580.159.04")))["iommu"].severity == "ok"


def test_gather_replays_the_recorded_files(tmp_path: Path, facts: dict[str, Any]) -> None:
    # The module_utils reader, over the very files recorded on the H200, gives the same facts.
    with tarfile.open(HOST_FACTS_TARBALL) as tar:
        tar.extractall(tmp_path, filter="tar")
    spec = importlib.util.spec_from_file_location("nvidia_host", MODULE_UTILS / "nvidia_host.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    replayed = module.gather(str(tmp_path / "sysroot"))
    assert replayed["config_root"] == replayed["root"]
    for key in ("driver", "uvm", "gpus", "os"):
        assert replayed[key] == facts[key], key
    assert replayed["kernel"]["cmdline"] == facts["kernel"]["cmdline"]


@pytest.mark.parametrize("before,after", [
    ("options vfio-pci ids=10de:2bb1,10de:22e8\n", vfio.MODPROBE_MARK),
    ("options vfio-pci ids=10de:2bb1,8086:1234 disable_vga=1\n", vfio.MODPROBE_MARK + "options vfio-pci ids=8086:1234 disable_vga=1\n"),
    ("options vfio_pci ids=10de:2bb1 disable_vga=1\n", vfio.MODPROBE_MARK + "options vfio_pci disable_vga=1\n"),
    ("options vfio-pci ids=8086:1234\n", "options vfio-pci ids=8086:1234\n"),  # not ours to touch: no mark either
    ("# options vfio-pci ids=10de:2bb1\noptions kvm ignore_msrs=1\n", "# options vfio-pci ids=10de:2bb1\noptions kvm ignore_msrs=1\n"),
])
def test_release_modprobe(before: str, after: str) -> None:
    assert vfio.release_modprobe(before) == after
    assert not vfio.nvidia_ids_in(vfio.MODPROBE_MARK)  # the mark itself names no id
    assert vfio.release_modprobe(after) == after  # idempotent


@pytest.mark.parametrize("before,after", [
    ('GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt vfio-pci.ids=10de:2bb1,10de:22e8"\n', 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n'),
    ("root=ZFS=rpool/ROOT/pve-1 boot=zfs vfio-pci.ids=10de:2bb1,1af4:1041 quiet", "root=ZFS=rpool/ROOT/pve-1 boot=zfs vfio-pci.ids=1af4:1041 quiet"),
    ("root=/dev/sda1 quiet", "root=/dev/sda1 quiet"),
])
def test_release_cmdline(before: str, after: str) -> None:
    assert vfio.release_cmdline(before) == after
    assert vfio.release_cmdline(after) == after
    assert vfio.nvidia_ids_in(after) == []
