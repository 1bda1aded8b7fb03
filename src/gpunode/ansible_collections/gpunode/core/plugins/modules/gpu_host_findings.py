#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_host_findings
short_description: Evaluate a GPU host's facts into findings, failing on blocking ones
description:
  - Turns the facts of M(gpunode.core.nvidia_host_facts) into named findings (os, gpus, gpu_binding, driver,
    open_module, iommu, hmm, persistenced, device_nodes; per kernel kernel_module, kernel_headers,
    dkms_build, kernel_support when the facts hold C(kernels); and acs, bar1, p2p_mode, aspm about the PCIe fabric
    when they hold C(fabric)), each with its fix.
  - Fails, before anything is changed, when a finding is blocking (something the host stage cannot fix by itself).
  - Runs on the controller with gpunode's interpreter (it imports the gpunode package).
version_added: 0.1.0
author:
  - gpunode developers (!UNKNOWN)
requirements:
  - the gpunode Python package on the controller
options:
  facts:
    description: The facts returned by M(gpunode.core.nvidia_host_facts).
    type: dict
    required: true
  driver_version:
    description: The NVIDIA driver version the host must run (570 or newer for SM120).
    type: str
    required: true
  open_module:
    description: Require NVIDIA's open kernel module (Blackwell needs it).
    type: bool
    default: true
  disable_hmm:
    description: Expect C(uvm_disable_hmm=1) (otherwise cuInit fails with error 3 on some kernels).
    type: bool
    default: true
  release_vfio:
    description: The host stage may release GPUs bound to vfio-pci, so such a binding is not blocking.
    type: bool
    default: true
  persistenced:
    description: Expect nvidia-persistenced to run.
    type: bool
    default: true
  installer:
    description: A driver installer is configured, so a missing or wrong driver is not blocking.
    type: bool
    default: false
  pin_kernel:
    description: The host stage may pin a kernel the module is built for, so a failed DKMS build for the kernel that boots next is not blocking.
    type: bool
    default: false
  clear_acs:
    description: The host stage clears ACS redirect at boot on the downstream ports of switches shared by GPUs (its own setpci unit).
    type: bool
    default: false
  p2p_registry:
    description: The host stage gives the nvidia module the P2P registry keys direct-attached GPUs need (its own modprobe.d file).
    type: bool
    default: false
  link_power_off:
    description: The host stage puts C(pcie_aspm=off pcie_port_pm=off) on the kernel command line.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Judge the host's facts
  gpunode.core.gpu_host_findings:
    facts: "{{ host_facts.facts }}"
    driver_version: "580.95.05"
  delegate_to: localhost
"""

RETURN = r"""
findings:
  description: Every finding, with name, status (ok, fail, warn), detail, fix and whether it blocks.
  returned: always
  type: list
  elements: dict
failed_findings:
  description: Names of the findings that failed without blocking (fixed by the host stage).
  returned: success
  type: list
  elements: str
gpunode_summary:
  description: One line per finding, for gpunode's progress output.
  returned: always
  type: str
fabric_repairs:
  description: What the host stage would repair in the PCIe fabric, whether or not prepare lets it.
  returned: success
  type: dict
  contains:
    acs_bridges:
      description: The downstream ports of switches shared by two or more GPUs, where the host stage clears ACS redirect.
      type: list
      elements: str
    p2p_registry:
      description: Whether some pair of GPUs shares no PCIe switch, so the nvidia module needs the P2P keys.
      type: bool
    registry_dwords:
      description: The value of C(NVreg_RegistryDwords) the host stage writes.
      type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import guard


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "facts": {"type": "dict", "required": True},
            "driver_version": {"type": "str", "required": True},
            "open_module": {"type": "bool", "default": True},
            "disable_hmm": {"type": "bool", "default": True},
            "release_vfio": {"type": "bool", "default": True},
            "persistenced": {"type": "bool", "default": True},
            "installer": {"type": "bool", "default": False},
            "pin_kernel": {"type": "bool", "default": False},
            "clear_acs": {"type": "bool", "default": False},
            "p2p_registry": {"type": "bool", "default": False},
            "link_power_off": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    guard.run(module, "gpu_host_findings", _run)


def _run(module: AnsibleModule) -> None:
    from gpunode.stages.host import fabric
    from gpunode.stages.host.findings import Expectations, as_dicts, evaluate

    p = module.params
    expect = Expectations(p["driver_version"], p["open_module"], p["disable_hmm"], p["release_vfio"],
                          p["persistenced"], p["installer"], p["pin_kernel"])
    findings = evaluate(p["facts"], expect)
    facts_fabric = p["facts"].get("fabric") or {}
    if facts_fabric:
        findings += fabric.evaluate_fabric(facts_fabric, p["facts"].get("modprobe") or [], fabric.FabricExpectations(
            p["clear_acs"], p["p2p_registry"], p["link_power_off"]))
    repairs = {"acs_bridges": fabric.acs_to_clear(facts_fabric), "p2p_registry": fabric.wants_p2p_registry(facts_fabric),
               "registry_dwords": fabric.P2P_REGISTRY_DWORDS}
    summary = "\n".join(f.line(severity=True, fix=True) for f in findings)
    blocking = [f for f in findings if f.blocking]
    if blocking:
        module.fail_json(msg="host preflight: " + "; ".join(f.line(severity=True, fix=True) for f in blocking),
                         findings=as_dicts(findings), gpunode_summary=summary)
    module.exit_json(changed=False, findings=as_dicts(findings), gpunode_summary=summary,
                     failed_findings=[f.code for f in findings if f.severity == "fail"], fabric_repairs=repairs)


if __name__ == "__main__":
    main()
