#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_host_facts
short_description: Read a GPU host's NVIDIA driver, HMM, PCI fabric, IOMMU and device-node state
description:
  - Reads files only, so it changes nothing and runs in check mode.
  - Runtime state (C(/proc), C(/sys), C(/run)) is read under O(facts_root); configuration (C(/etc), dpkg's
    status) under C(/); the NVIDIA device nodes under O(dev_root).
  - The gpunode lab points O(facts_root) at files recorded on a real GPU machine.
version_added: 0.1.0
author:
  - gpunode developers (!UNKNOWN)
options:
  facts_root:
    description: Prefix under which C(/proc), C(/sys) and C(/run) are read.
    type: path
    default: /
  dev_root:
    description: Directory holding the NVIDIA device nodes.
    type: path
    default: /dev
  driver_version:
    description:
      - The driver whose DKMS module is looked for per installed kernel (C(/boot/vmlinuz-*), headers from dpkg's
        status, DKMS's tree under C(/var/lib/dkms), the module under C(/lib/modules/<kernel>/updates/dkms)).
      - Empty means the newest version registered with DKMS.
    type: str
    default: ""
  gather_subset:
    description:
      - Which facts to read. C(all) reads everything below; C(fabric) only C(fabric), as the p2p stage needs it
        for its verdict (no device nodes, no kernels, no dpkg status).
    type: str
    choices: [all, fabric]
    default: all
"""

EXAMPLES = r"""
- name: Read the Proxmox host's GPU facts
  gpunode.core.nvidia_host_facts:
  register: host_facts

- name: Read facts recorded on another machine
  gpunode.core.nvidia_host_facts:
    facts_root: /var/lib/gpunode-lab-facts

- name: Read only the PCIe fabric under the GPUs (for the p2p verdict)
  gpunode.core.nvidia_host_facts:
    gather_subset: fabric
  register: host_fabric
"""

RETURN = r"""
facts:
  description:
    - The host's state, key by key, as gpunode.stages.host.findings reads it.
    - C(driver) (loaded, version, open module), C(uvm) (HMM disabled or not), C(gpus) (PCI address, id, bound driver),
      C(kernel) (command line, IOMMU), C(os), C(modprobe) (lines configuring vfio or nvidia), C(persistenced), C(devices),
      C(kernels) (the installed kernels, the one that boots next and why, headers and the NVIDIA module per kernel),
      C(fabric) (per GPU the bridges up to its root port with their PCIe port type and ACS control bits, BAR1 and the
      link; the nvidia module's P2P parameters in effect; the kernel command line's link power settings), as
      gpunode.stages.host.fabric reads it.
    - With O(gather_subset=fabric), only C(fabric).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import guard, kernels, pci_fabric
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_host import gather
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_nodes import scan


def main() -> None:
    module = AnsibleModule(
        argument_spec={"facts_root": {"type": "path", "default": "/"}, "dev_root": {"type": "path", "default": "/dev"},
                       "driver_version": {"type": "str", "default": ""},
                       "gather_subset": {"type": "str", "default": "all", "choices": ["all", "fabric"]}},
        supports_check_mode=True,
    )
    guard.run(module, "nvidia_host_facts", _run)


def _run(module: AnsibleModule) -> None:
    if module.params["gather_subset"] == "fabric":
        module.exit_json(changed=False, facts={"fabric": pci_fabric.gather(module.params["facts_root"])})
    facts = gather(module.params["facts_root"], config_root="/")
    facts["devices"] = scan(module.params["dev_root"], try_open=False)
    # The PCIe fabric under the GPUs (bridges, ACS, BAR1, the module's P2P keys, link power): runtime state.
    facts["fabric"] = pci_fabric.gather(module.params["facts_root"])
    # Kernels are configuration (what boots next): read under /, like dpkg's status.
    facts["kernels"] = kernels.gather("/", module.params["facts_root"], version=module.params["driver_version"])
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
