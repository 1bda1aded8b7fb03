"""The host stage's fabric findings (issue #35): acs, bar1, p2p_mode and aspm from pci_fabric's
facts, on the H200's own recording and on the two topologies tests/fakes/fabric.py builds (two GPUs
under one switch, two direct-attached), each severity following the topology."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from gpunode.ansible_collections.gpunode.core.plugins.module_utils import pci_fabric
from fakes.fabric import ACS_OFF, REQ_REDIR_CMPLT, direct_pair, switch_pair
from gpunode.stages.host import fabric
from gpunode.stages.host.fabric import FabricExpectations, evaluate_fabric

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "host" / "h200" / "fabric" / "fabric-sysroot.tar.gz"


KEYS = "options nvidia NVreg_RegistryDwords=\"" + fabric.P2P_REGISTRY_DWORDS + "\""


def found(facts: dict, modprobe: list | None = None, **expect: bool) -> dict:
    return {f.code: f for f in evaluate_fabric(facts, modprobe or [], FabricExpectations(**expect))}


def gathered(root: Path, cmdline: str = "", params: str | None = 'ResmanDebugLevel: 4294967295\nRegistryDwords: ""\n') -> dict:
    """pci_fabric's facts of a built tree, with /proc/cmdline and the loaded module's params (the
    driver's format: one "Name: value" per line); params None: the module is not loaded."""
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "cmdline").write_text(cmdline + "\n")
    if params is not None:
        (root / "proc" / "driver" / "nvidia" / "params").write_text(params)
    return pci_fabric.gather(str(root))


def test_the_h200_recording_has_nothing_to_redirect_and_a_full_bar1(tmp_path: Path) -> None:
    with tarfile.open(RECORDING) as tar:
        tar.extractall(tmp_path, filter="data")
    result = found(pci_fabric.gather(str(tmp_path / "sysroot")))
    assert [(f.code, f.severity) for f in result.values()] == [("acs", "ok"), ("bar1", "ok"), ("p2p_mode", "ok"),
                                                             ("aspm", "warn")]
    assert result["acs"].message.startswith("no bridge above the GPUs")
    assert result["bar1"].message == "BAR1 256 GiB on 1 GPU(s): Resizable BAR is on"
    assert result["aspm"].message.startswith("PCIe link power management is on (pcie_aspm=(kernel default)")


def test_acs_on_the_downstream_ports_of_a_shared_switch_fails(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = gathered(tmp_path)
    result = found(facts)
    acs = result["acs"]
    assert acs.severity == "fail" and not acs.blocking
    assert "0000:02:08.0 (switch downstream port: ReqRedir+ CmpltRedir+, above 0000:03:00.0)" in acs.message
    assert "0000:02:10.0" in acs.message and "0000:00:01.0" not in acs.message  # the root port's ACS is off
    assert acs.fix.startswith("set prepare.clear_acs")
    assert found(facts, clear_acs=True)["acs"].fix.startswith(
        "the host stage clears ReqRedir and CmpltRedir on 0000:02:08.0, 0000:02:10.0 at each boot")
    assert fabric.acs_to_clear(facts) == ["0000:02:08.0", "0000:02:10.0"]
    # One switch between them: no staging through system memory, whatever the registry says.
    assert result["p2p_mode"].severity == "ok" and "shares a PCIe switch" in result["p2p_mode"].message
    assert fabric.direct_pairs(facts["gpus"]) == []
    assert fabric.shared_switch_ports(facts["gpus"]) == {"0000:02:08.0": "0000:01:00.0", "0000:02:10.0": "0000:01:00.0"}
    assert [g["address"] for g in facts["gpus"]] == gpus


def test_acs_off_on_the_switch_is_ok(tmp_path: Path) -> None:
    switch_pair(tmp_path, acs=ACS_OFF)
    result = found(gathered(tmp_path))
    assert result["acs"].severity == "ok" and result["acs"].message == "no ACS redirect on the 4 bridge(s) above the GPUs"


def test_acs_on_root_ports_of_direct_attached_gpus_warns(tmp_path: Path) -> None:
    direct_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    acs = found(gathered(tmp_path))["acs"]
    assert acs.severity == "warn" and "0000:00:01.0 (root port: ReqRedir+ CmpltRedir+, above 0000:01:00.0)" in acs.message


def test_a_legacy_bar1_fails_and_a_small_one_warns(tmp_path: Path) -> None:
    switch_pair(tmp_path / "legacy", bar1_bytes=256 * 2**20)
    bar1 = found(gathered(tmp_path / "legacy"))["bar1"]
    assert bar1.severity == "fail" and "legacy 256 MiB window" in bar1.message
    assert "0000:03:00.0 256 MiB, 0000:04:00.0 256 MiB" in bar1.message and "Resizable BAR" in bar1.fix
    switch_pair(tmp_path / "small", bar1_bytes=32 * 2**30)
    small = found(gathered(tmp_path / "small"))["bar1"]
    assert small.severity == "warn" and "0000:03:00.0 32 GiB" in small.message


def test_direct_attached_gpus_need_the_registry_keys(tmp_path: Path) -> None:
    direct_pair(tmp_path)
    facts = gathered(tmp_path)
    mode = found(facts)["p2p_mode"]
    assert mode.severity == "warn" and fabric.direct_pairs(facts["gpus"]) == [("0000:01:00.0", "0000:41:00.0")]
    assert "lacks ForceP2P=0x11, RMForceP2PType=1" in mode.message and "15x slower" in mode.message
    assert mode.fix.startswith("set prepare.p2p_registry")
    assert found(facts, p2p_registry=True)["p2p_mode"].fix.startswith("the host stage writes NVreg_RegistryDwords=")
    # Written to modprobe.d but the loaded module predates it: pending, a reload or reboot named.
    pending = found(facts, [{"file": "/etc/modprobe.d/gpunode-nvidia-p2p.conf", "line": KEYS}])["p2p_mode"]
    assert pending.message.endswith("modprobe.d has the keys, not yet in effect") and "reboot" in pending.fix
    # In effect: the module's own params say so.
    live = gathered(tmp_path, params=f'RegistryDwords: "{fabric.P2P_REGISTRY_DWORDS}"\n')
    assert found(live)["p2p_mode"].severity == "ok"
    half = gathered(tmp_path, params='RegistryDwords: "ForceP2P=0x11"\n')
    assert "lacks RMForceP2PType=1" in found(half)["p2p_mode"].message
    (tmp_path / "proc" / "driver" / "nvidia" / "params").unlink()
    unloaded = found(gathered(tmp_path, params=None))["p2p_mode"]
    assert unloaded.severity == "warn" and "the nvidia module is not loaded" in unloaded.message


def test_link_power_off_on_the_command_line_is_ok(tmp_path: Path) -> None:
    direct_pair(tmp_path)
    assert found(gathered(tmp_path, "ro quiet pcie_aspm=off pcie_port_pm=off"))["aspm"].severity == "ok"
    half = found(gathered(tmp_path, "ro pcie_aspm=off"), link_power_off=True)["aspm"]
    assert half.severity == "warn" and "pcie_port_pm=(kernel default)" in half.message
    assert half.fix.startswith("the host stage adds pcie_aspm=off pcie_port_pm=off")


@pytest.mark.parametrize("line, keys", [
    (KEYS, pci_fabric.P2P_REGISTRY),
    ("options nvidia NVreg_RegistryDwords=ForceP2P=0x11", {"ForceP2P": "0x11"}),
    ("options nvidia_uvm NVreg_RegistryDwords=\"ForceP2P=0x11\"", {}),  # another module
    ("# options nvidia NVreg_RegistryDwords=\"ForceP2P=0x11\"", {}),
])
def test_modprobe_lines_are_read_as_modprobe_does(line: str, keys: dict) -> None:
    assert fabric.configured_registry([{"file": "/etc/modprobe.d/x.conf", "line": line}]) == keys


def test_the_acs_unit_runs_setpci_once_per_bridge_and_refuses_what_is_no_address() -> None:
    unit = fabric.acs_unit(["0000:02:10.0", "0000:02:08.0", "0000:02:08.0"])
    assert [line for line in unit.splitlines() if line.startswith("ExecStart=")] == [
        "ExecStart=/usr/bin/setpci -s 0000:02:08.0 ECAP_ACS+0x6.w=0000:000c",
        "ExecStart=/usr/bin/setpci -s 0000:02:10.0 ECAP_ACS+0x6.w=0000:000c"]
    assert unit.startswith("# Managed by gpunode") and "WantedBy=multi-user.target" in unit
    for bad in (["0000:02:08.0; reboot"], ["-s"], ["0000:02:08.0\nExecStart=/bin/sh"], ["0000:02:08.0\n"], []):
        with pytest.raises(ValueError):
            fabric.acs_unit(bad)


@pytest.mark.parametrize("before, after", [
    ("root=ZFS=rpool/ROOT/pve-1 boot=zfs\n", "root=ZFS=rpool/ROOT/pve-1 boot=zfs pcie_aspm=off pcie_port_pm=off\n"),
    ("quiet pcie_aspm=force iommu=pt\n", "quiet iommu=pt pcie_aspm=off pcie_port_pm=off\n"),
    ("quiet pcie_aspm=off pcie_port_pm=off\n", "quiet pcie_aspm=off pcie_port_pm=off\n"),  # already: unchanged
    ('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
     'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet pcie_aspm=off pcie_port_pm=off"\nGRUB_CMDLINE_LINUX=""\n'),
    ('# a comment\nGRUB_CMDLINE_LINUX_DEFAULT="quiet pcie_aspm=off pcie_port_pm=off"\n',
     '# a comment\nGRUB_CMDLINE_LINUX_DEFAULT="quiet pcie_aspm=off pcie_port_pm=off"\n'),
    ("", ""),
    ("GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n", "GRUB_CMDLINE_LINUX_DEFAULT='quiet pcie_aspm=off pcie_port_pm=off'\n"),
    ('  export GRUB_CMDLINE_LINUX_DEFAULT=quiet\n', '  export GRUB_CMDLINE_LINUX_DEFAULT="quiet pcie_aspm=off pcie_port_pm=off"\n'),
])
def test_link_power_off_on_a_command_line_file(before: str, after: str) -> None:
    assert fabric.with_link_power_off(before) == after
    assert fabric.with_link_power_off(after) == after  # a second run writes nothing


def test_the_command_line_edit_releases_vfio_and_turns_link_power_off_as_asked() -> None:
    line = "quiet vfio-pci.ids=10de:2bb1,8086:1234\n"
    assert fabric.edit_cmdline(line, True, False) == "quiet vfio-pci.ids=8086:1234\n"
    assert fabric.edit_cmdline(line, False, True) == "quiet vfio-pci.ids=10de:2bb1,8086:1234 pcie_aspm=off pcie_port_pm=off\n"
    assert fabric.edit_cmdline(line, True, True) == "quiet vfio-pci.ids=8086:1234 pcie_aspm=off pcie_port_pm=off\n"
    assert fabric.edit_cmdline(line, False, False) == line


# -- a real machine's lspci (tests/fixtures/host/fabric/SOURCE.md) --------------------------------
FABRIC = ROOT / "tests" / "fixtures" / "host" / "fabric"
# What Linux turns on where the IOMMU asks for isolation (drivers/pci/pci.c, pci_std_enable_acs):
# SrcValid, ReqRedir, CmpltRedir, UpstreamFwd.
KERNEL_ACS_ON = 0b0011101


def lspci_acs(path: Path) -> tuple[int, int, dict[str, bool]]:
    """(the ACS capability's offset, ACSCtl as a register value, ACSCtl by name) from lspci -vvv text."""
    text = path.read_text()
    offset = int(text.split("] Access Control Services")[0].rsplit("[", 1)[1].split()[0], 16)
    words = text.split("ACSCtl:")[1].split("\n")[0].split()
    named = {word[:-1]: word.endswith("+") for word in words}
    assert list(named) == list(pci_fabric.ACS_BITS)  # lspci's names, in our bit order
    return offset, sum(1 << bit for bit, name in enumerate(pci_fabric.ACS_BITS) if named[name]), named


@pytest.mark.parametrize("name, port", [("asus-pex890xx-02-03-0.lspci.txt", 0x6), ("asus-turin-00-01-1.lspci.txt", 0x4)])
def test_acs_reads_as_lspci_printed_it_on_a_real_switch_fabric(name: str, port: int) -> None:
    from fakes.fabric import config_space

    offset, value, named = lspci_acs(FABRIC / name)
    assert value == 0x0011  # the machine's owners cleared redirect, keeping SrcValid and UpstreamFwd
    assert pci_fabric.acs_control(config_space(port, value, acs_at=offset)) == named
    # The kernel's ACS-on, cleared by the unit's value:mask write, is what that machine shows.
    assert KERNEL_ACS_ON & ~fabric.ACS_CLEAR_MASK == value


def test_the_units_write_turns_a_failing_switch_into_a_passing_one(tmp_path: Path) -> None:
    switch_pair(tmp_path / "on", acs=KERNEL_ACS_ON)
    assert found(gathered(tmp_path / "on"))["acs"].severity == "fail"
    switch_pair(tmp_path / "cleared", acs=KERNEL_ACS_ON & ~fabric.ACS_CLEAR_MASK)
    assert found(gathered(tmp_path / "cleared"))["acs"].severity == "ok"


def test_acs_on_a_port_of_a_top_switch_is_judged_by_that_switch_not_the_gpus_nearest(tmp_path: Path) -> None:
    """Two GPUs under one top switch, one of them behind a second switch: the top switch's
    downstream ports carry the traffic between them, so ACS there fails."""
    from fakes.fabric import ENDPOINT, ROOT_PORT, SWITCH_DOWN, SWITCH_UP, config_space, device, gpu_resource

    top = "/sys/devices/pci0000:00/0000:00:01.0"
    device(tmp_path, top, config_space(ROOT_PORT, ACS_OFF))
    device(tmp_path, f"{top}/0000:01:00.0", config_space(SWITCH_UP))
    one = f"{top}/0000:01:00.0/0000:02:00.0"
    device(tmp_path, one, config_space(SWITCH_DOWN, REQ_REDIR_CMPLT))
    device(tmp_path, f"{one}/0000:03:00.0", config_space(ENDPOINT), klass="0x030200", resource=gpu_resource(2**37))
    two = f"{top}/0000:01:00.0/0000:02:01.0"
    device(tmp_path, two, config_space(SWITCH_DOWN, REQ_REDIR_CMPLT))
    device(tmp_path, f"{two}/0000:04:00.0", config_space(SWITCH_UP))
    device(tmp_path, f"{two}/0000:04:00.0/0000:05:00.0", config_space(SWITCH_DOWN, ACS_OFF))
    device(tmp_path, f"{two}/0000:04:00.0/0000:05:00.0/0000:06:00.0", config_space(ENDPOINT), klass="0x030200",
           resource=gpu_resource(2**37))
    facts = gathered(tmp_path)
    assert found(facts)["acs"].severity == "fail"
    # The second switch holds one GPU: its port is not cleared; the top switch's two are.
    assert fabric.acs_to_clear(facts) == ["0000:02:00.0", "0000:02:01.0"]


def test_the_list_to_clear_stays_the_same_once_the_unit_has_cleared_the_bits(tmp_path: Path) -> None:
    switch_pair(tmp_path / "on", acs=REQ_REDIR_CMPLT)
    switch_pair(tmp_path / "off", acs=ACS_OFF)
    assert fabric.acs_to_clear(gathered(tmp_path / "on")) == fabric.acs_to_clear(gathered(tmp_path / "off")) == [
        "0000:02:08.0", "0000:02:10.0"]
    # Root ports are the firmware's: named (warn), never in the unit.
    direct_pair(tmp_path / "direct", acs=REQ_REDIR_CMPLT)
    assert fabric.acs_to_clear(gathered(tmp_path / "direct")) == []


@pytest.mark.parametrize("grub", [
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet" # iommu\n',  # something after the value
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet\n  iommu=pt"\n',  # a value over two lines
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet $EXTRA"\n',  # shell expansion: not gpunode's to guess
    'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX="quiet"\n',  # no DEFAULT line
])
def test_a_grub_file_gpunode_cannot_edit_safely_is_refused_not_mangled(grub: str) -> None:
    with pytest.raises(ValueError, match="by hand"):
        fabric.with_link_power_off(grub)
