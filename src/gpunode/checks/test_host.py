"""Layer host: the Proxmox host's driver, HMM, vfio, persistenced, device nodes and PCIe fabric.

The same findings as the host stage's preflight (gpunode.stages.host.findings and .fabric), one test
each, plus what the stage manages on disk. A finding the stage has configured but that waits for a
reload or reboot is reported as pending (xfail), not as passing.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.checks.conftest import _remote_python
from gpunode.stages.host.fabric import FabricExpectations, acs_to_clear, evaluate_fabric
from gpunode.stages.host.findings import Expectations, Finding, evaluate

FINDINGS = ("gpus", "gpu_binding", "driver", "open_module", "iommu", "hmm", "persistenced", "device_nodes",
            "kernel_headers", "dkms_build", "kernel_support", "acs", "bar1")  # p2p_mode, aspm: advice, never a failure
HMM_CONF = "/etc/modprobe.d/gpunode-nvidia-uvm.conf"
NODES_UNIT = "gpunode-nvidia-nodes.service"
ACS_UNIT = "gpunode-pcie-acs.service"


def _hmm_configured(host: Any) -> bool:
    # testinfra's contains() raises on a missing file (grep exits 2): ask exists() first.
    conf = host.file(HMM_CONF)
    return bool(conf.exists and conf.contains("^options nvidia_uvm uvm_disable_hmm=1"))


def _acs_unit_covers(host: Any, ports: list[str]) -> bool:
    """The ACS unit is enabled and runs setpci on every port that needs it."""
    unit = host.file(f"/etc/systemd/system/{ACS_UNIT}")
    if not ports or not unit.exists or not host.service(ACS_UNIT).is_enabled:
        return False
    text = unit.content_string
    return all(f"setpci -s {port} " in text for port in ports)


def _expect(gpunode_host: dict[str, Any]) -> Expectations:
    prepare = gpunode_host["prepare"]
    installer = gpunode_host["driver"]["installer"]
    return Expectations(gpunode_host["driver"]["version"], True, prepare["disable_hmm"], prepare["release_vfio"],
                        prepare["persistenced"], bool(installer.get("url") or installer.get("local_file")),
                        prepare.get("pin_kernel", False))


def _findings(host_facts: dict[str, Any], gpunode_host: dict[str, Any]) -> list[Finding]:
    prepare = gpunode_host["prepare"]
    fabric = FabricExpectations(prepare.get("clear_acs", False), prepare.get("p2p_registry", False),
                                prepare.get("link_power_off", False))
    return evaluate(host_facts, _expect(gpunode_host)) + evaluate_fabric(host_facts.get("fabric") or {},
                                                                         host_facts.get("modprobe") or [], fabric)


@pytest.mark.parametrize("name", FINDINGS)
def test_host_finding(name: str, pve_host: Any, gpunode_host: dict[str, Any], host_facts: dict[str, Any]) -> None:
    findings = [f for f in _findings(host_facts, gpunode_host) if f.code == name]
    failed = [f for f in findings if f.severity == "fail"]
    recorded = gpunode_host["facts_root"] != "/"
    if name == "hmm" and failed and _hmm_configured(pve_host):
        pytest.xfail(f"pending: {failed[0].message}: configured in {HMM_CONF}; reload nvidia_uvm or reboot")
    if name == "acs" and failed and _acs_unit_covers(pve_host, acs_to_clear(host_facts.get("fabric") or {})):
        pytest.xfail(f"pending: {failed[0].message}: {ACS_UNIT} clears it at the next boot")
    if name == "persistenced" and recorded and findings and findings[0].severity != "ok":
        pytest.xfail(f"recorded state ({gpunode_host['facts_root']}): {findings[0].message}")
    assert not failed, "; ".join(f"{f.message} -> fix: {f.fix}" for f in failed)


def test_hmm_option_configured(pve_host: Any, gpunode_host: dict[str, Any]) -> None:
    if not gpunode_host["prepare"]["disable_hmm"]:
        pytest.skip("prepare.disable_hmm is false in the host file")
    assert _hmm_configured(pve_host), (
        f"{HMM_CONF} lacks `options nvidia_uvm uvm_disable_hmm=1` (cuInit error 3 otherwise): "
        "run `gpunode provision --tags host`")


def test_device_node_unit_enabled(pve_host: Any) -> None:
    service = pve_host.service(NODES_UNIT)
    assert service.is_enabled, f"{NODES_UNIT} is not enabled (nvidia-uvm nodes missing after boot): " \
                               "run `gpunode provision --tags host`"


def test_no_nvidia_ids_left_for_vfio(pve_host: Any, host_facts: dict[str, Any]) -> None:
    leftovers = [f"{item['file']}: {item['line']}" for item in host_facts["modprobe"] if "10de:" in item["line"]
                 and "vfio" in item["line"]]
    assert not leftovers, f"NVIDIA GPUs still handed to vfio-pci by {leftovers}: run `gpunode provision --tags host`, then reboot"


def test_driver_tree_built_for_the_loaded_driver(pve_host: Any, gpunode_host: dict[str, Any],
                                                 gpunode_derived: dict[str, Any]) -> None:
    if not gpunode_derived["driver_mount"]:
        pytest.skip("nvidia-runtime hand-off: the container installs its own user space")
    survey = _remote_python(pve_host, "driver_tree", f"survey({gpunode_host['facts_root']!r})")
    if not survey["version"]:
        pytest.fail("no NVIDIA module loaded on the host: there is no user space to share")
    assert not survey["changes"], \
        f"the tree of the loaded driver {survey['version']} ({survey['path']}) is missing or out of date " \
        f"({len(survey['changes'])} files differ, e.g. {survey['changes'][0]}; trees here: " \
        f"{', '.join(survey['trees']) or 'none'}) -> run `gpunode provision --tags host`"


def test_module_built_for_kernel(kernel: str, pve_host: Any, gpunode_host: dict[str, Any],
                                 host_facts: dict[str, Any]) -> None:
    facts = host_facts["kernels"]
    entry = next((k for k in facts["kernels"] if k["version"] == kernel), None)
    if kernel == "no-kernel-found":
        pytest.fail("no installed kernel found (/boot/vmlinuz-*) on the host: a Proxmox host has at least one")
    if entry is None:
        pytest.skip(f"not-in-layer: kernel {kernel} is not installed on this host")
    version = facts["version"] or gpunode_host["driver"]["version"]
    role = " (boots next)" if entry["boots_next"] else ""
    fix = "run `gpunode provision --tags host` (it installs the headers and builds the module)"
    if entry["build_failed"]:
        fix = f"its DKMS build failed ({'; '.join(entry['make_log'][:2])}): " + (
            "set prepare.pin_kernel, or install a driver that supports it" if entry["boots_next"] else fix)
    if entry["boots_next"]:
        assert entry["module"] == "installed", \
            f"NVIDIA module {version} is {entry['module']} for {kernel}, the kernel that boots next: GPUs will be " \
            f"gone after the next reboot -> {fix}"
    elif entry["build_failed"]:
        # Kept, not booted: the stage pinned (or the operator chose) another kernel.
        pytest.xfail(f"pending: NVIDIA module {version} cannot be built for {kernel}, which does not boot next "
                     f"-> {fix}")
    else:
        assert entry["module"] == "installed", \
            f"NVIDIA module {version} is {entry['module']} for {kernel}{role} (a reboot into it would lose the " \
            f"GPUs) -> {fix}"
