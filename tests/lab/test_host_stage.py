"""The host stage for real, against the lab container that plays the Proxmox host (Debian 12,
systemd, sshd). Runtime state comes from readings recorded on a real H200; the files and units
the stage manages are the lab host's own. Idempotence is read from runner stats.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import gpunode_lab as lab
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
HOST = "pve-lab"
HMM_CONF = "/etc/modprobe.d/gpunode-nvidia-uvm.conf"
UNIT = "/etc/systemd/system/gpunode-nvidia-nodes.service"


def on_host(*remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote, host=lab.HOST_CONTAINER_IP), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def run(gpunode, *args: str, hosts: Path = LAB_HOSTS) -> tuple[int, dict[str, Any], str]:
    result = gpunode("provision", str(hosts), "--tags", "host", "--json", *args, timeout=600)
    return result.returncode, json.loads(result.stdout), result.stderr


def test_converges_then_changes_nothing(gpunode) -> None:
    on_host("rm", "-f", HMM_CONF, UNIT, "/etc/modprobe.d/vfio.conf")
    on_host("systemctl", "daemon-reload")
    rc, first, stderr = run(gpunode)
    assert rc == 0, stderr
    assert first["stats"]["changed"][HOST] >= 3  # the HMM option, the unit, enabling it (+ handlers)
    assert "options nvidia_uvm uvm_disable_hmm=1" in on_host("cat", HMM_CONF).stdout
    assert "ExecStart=/usr/bin/nvidia-modprobe -c0 -u" in on_host("cat", UNIT).stdout
    assert on_host("systemctl", "is-enabled", "gpunode-nvidia-nodes.service").stdout.strip() == "enabled"
    # Findings come first, by name, with their fixes; the recap says what still needs a reload.
    assert "FAIL hmm: uvm_disable_hmm=N" in stderr and "OK   driver: driver 580.159.04" in stderr
    assert "needs: ['reload nvidia_uvm or reboot: live uvm_disable_hmm=N']" in stderr
    rc, second, _ = run(gpunode)
    assert rc == 0 and not second["stats"].get("changed"), second["stats"]


def test_releases_gpus_from_vfio(gpunode) -> None:
    # ssh hands the remote shell one command line.
    on_host("printf 'options vfio-pci ids=10de:2bb1,10de:22e8,8086:1234 disable_vga=1\\n' > /etc/modprobe.d/vfio.conf")
    assert on_host("cat", "/etc/modprobe.d/vfio.conf").stdout.startswith("options vfio-pci ids=10de:2bb1")
    on_host("rm", "-f", "/etc/modprobe.d/vfio.conf.gpunode-orig")
    rc, summary, stderr = run(gpunode, "--diff")
    assert rc == 0, stderr
    assert on_host("cat", "/etc/modprobe.d/vfio.conf").stdout == (
        "# gpunode released NVIDIA GPUs from vfio-pci below; the original is kept as *.conf.gpunode-orig\n"
        "options vfio-pci ids=8086:1234 disable_vga=1\n")
    # The operator's file as it was, kept before the first change (modprobe reads only *.conf).
    assert on_host("cat", "/etc/modprobe.d/vfio.conf.gpunode-orig").stdout == (
        "options vfio-pci ids=10de:2bb1,10de:22e8,8086:1234 disable_vga=1\n")
    assert "-options vfio-pci ids=10de:2bb1,10de:22e8,8086:1234 disable_vga=1" in stderr
    assert "Rebuild the initramfs" in stderr  # the handler ran
    rc, again, _ = run(gpunode)
    assert rc == 0 and not again["stats"].get("changed")
    on_host("rm", "-f", "/etc/modprobe.d/vfio.conf", "/etc/modprobe.d/vfio.conf.gpunode-orig")


def test_check_mode_writes_nothing(gpunode) -> None:
    on_host("rm", "-f", HMM_CONF)
    rc, summary, _ = run(gpunode, "--check")
    assert rc == 0 and summary["stats"]["changed"][HOST] >= 1
    assert on_host("test", "-e", HMM_CONF).returncode == 1
    assert run(gpunode)[0] == 0


def test_blocking_finding_stops_before_any_change(gpunode, tmp_path: Path) -> None:
    on_host("rm", "-f", HMM_CONF)
    hosts = tmp_path / "host.yml"
    hosts.write_text(LAB_HOSTS.read_text().replace('version: "580.159.04"', 'version: "580.95.05"'))
    rc, summary, _ = run(gpunode, hosts=hosts)
    assert rc == 1
    failure = summary["failures"][0]
    assert failure["task"] == "Evaluate the host (named findings, each with its fix)"
    assert "driver 580.159.04 loaded, host file pins 580.95.05" in failure["message"]
    assert on_host("test", "-e", HMM_CONF).returncode == 1, "a blocked preflight changed the host"
    assert run(gpunode)[0] == 0


BAD_FABRIC_ROOT = "/var/lib/gpunode-lab-facts-badfabric"
ACS_UNIT = "/etc/systemd/system/gpunode-pcie-acs.service"
P2P_CONF = "/etc/modprobe.d/gpunode-nvidia-p2p.conf"


def test_a_bad_pcie_fabric_is_named_repaired_where_allowed_and_shown_by_check(gpunode, tmp_path: Path) -> None:
    """The lab host's recorded facts with one bad fabric added (built after the PCIe spec's layouts,
    tests/fakes/fabric.py: two GPUs under one switch whose downstream ports have the kernel's ACS on,
    and a BAR1 of the legacy 256 MiB window): the host stage names acs and bar1, and with
    prepare.clear_acs and prepare.p2p_registry writes its own unit and modprobe file, once; BAR1 is
    the firmware's, left for the operator; `gpunode check --layer host` reports both."""
    import shutil

    from fakes.fabric import switch_pair

    rootfs = lab.HOST_CONTAINER.rootfs
    facts = rootfs / BAD_FABRIC_ROOT.lstrip("/")
    shutil.rmtree(facts, ignore_errors=True)
    shutil.copytree(rootfs / lab.LAB_HOST_FACTS_ROOT.lstrip("/"), facts, symlinks=True)
    on_host("rm", "-f", ACS_UNIT, P2P_CONF)
    try:
        switch_pair(facts, acs=0b0011101, bar1_bytes=256 * 2**20)
        data = yaml.safe_load(LAB_HOSTS.read_text())
        data["hosts"][0]["facts_root"] = BAD_FABRIC_ROOT
        named = tmp_path / "named.yml"
        named.write_text(yaml.safe_dump(data, sort_keys=False))
        rc, summary, stderr = run(gpunode, hosts=named)
        assert rc == 0, stderr  # neither blocks: the stage goes on, names them, changes nothing for them
        assert "FAIL acs: ACS redirects peer traffic through the root complex between GPUs under one PCIe switch" \
            in stderr and "0000:02:08.0 (switch downstream port: ReqRedir+ CmpltRedir+, above 0000:03:00.0)" in stderr
        assert "FAIL bar1: BAR1 is the legacy 256 MiB window" in stderr and "-> fix: set prepare.clear_acs" in stderr
        assert on_host("test", "-e", ACS_UNIT).returncode == 1 and on_host("test", "-e", P2P_CONF).returncode == 1

        data["hosts"][0].setdefault("prepare", {}).update(clear_acs=True, p2p_registry=True)
        repaired = tmp_path / "repaired.yml"
        repaired.write_text(yaml.safe_dump(data, sort_keys=False))
        rc, first, stderr = run(gpunode, hosts=repaired)
        assert rc == 0, stderr
        assert first["stats"]["changed"][HOST] >= 3  # the unit, enabling it, the modprobe file (+ initramfs)
        unit = on_host("cat", ACS_UNIT).stdout
        assert [line for line in unit.splitlines() if line.startswith("ExecStart=")] == [
            "ExecStart=/usr/bin/setpci -s 0000:02:08.0 ECAP_ACS+0x6.w=0000:000c",
            "ExecStart=/usr/bin/setpci -s 0000:02:10.0 ECAP_ACS+0x6.w=0000:000c"]
        assert on_host("systemctl", "is-enabled", "gpunode-pcie-acs.service").stdout.strip() == "enabled"
        # The H200 of the recording shares no switch with the two: direct-attached pairs need the keys.
        assert 'options nvidia NVreg_RegistryDwords="ForceP2P=0x11;RMForceP2PType=1;RMPcieP2PType=2;' \
               'GrdmaPciTopoCheckOverride=1;EnableResizableBar=1"' in on_host("cat", P2P_CONF).stdout
        assert "reboot (or start gpunode-pcie-acs.service): ACS redirect still on 0000:02:08.0, 0000:02:10.0" in stderr
        rc, second, _ = run(gpunode, hosts=repaired)
        assert rc == 0 and not second["stats"].get("changed"), second["stats"]
        check = gpunode("check", str(repaired), "--layer", "host", "--json", timeout=600)
        results = {r["check"]: r for r in json.loads(check.stdout)["results"]}
        assert results["test_host_finding[acs]"]["status"] == "pending", results["test_host_finding[acs]"]
        assert "gpunode-pcie-acs.service clears it at the next boot" in results["test_host_finding[acs]"]["message"]
        bar1 = results["test_host_finding[bar1]"]
        assert bar1["status"] == "fail" and "legacy 256 MiB window" in bar1["message"] and check.returncode == 1
    finally:
        on_host("systemctl", "disable", "gpunode-pcie-acs.service")
        on_host("rm", "-f", ACS_UNIT, P2P_CONF)
        on_host("systemctl", "daemon-reload")
        shutil.rmtree(facts, ignore_errors=True)
