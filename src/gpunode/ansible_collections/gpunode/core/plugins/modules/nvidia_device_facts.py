#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_device_facts
short_description: List /dev/nvidia* nodes with type, major, minor and whether they open
description:
  - Lists the NVIDIA device nodes of a machine with their major and minor numbers.
  - Read-only, so it runs in check mode too. Used where nodes are discovered (the Proxmox host) and
    where the hand-off is verified (inside the container).
version_added: 0.1.0
author:
  - gpunode developers (!UNKNOWN)
options:
  dev_root:
    description: The directory holding the nodes (tests point it elsewhere).
    type: path
    default: /dev
  try_open:
    description: Open each node read-only to tell "no driver" (ENXIO) from "not allowed" (EPERM).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Find the NVIDIA device nodes on the Proxmox host
  gpunode.core.nvidia_device_facts:
    try_open: false
  register: nodes

- name: Show the GPU nodes found
  ansible.builtin.debug:
    msg: "{{ nodes.gpus }}"
"""

RETURN = r"""
devices:
  description:
    - Map of node path (as /dev/...) to char, major, minor, mode, open_error (null when it opened).
    - Every NVIDIA name found, also one that is not a character device (C(char) false), so it can be named.
  returned: always
  type: dict
gpus:
  description: Paths of the /dev/nvidiaN GPU nodes that are character devices, by minor number.
  returned: always
  type: list
  elements: str
caps:
  description: Paths of /dev/nvidia-caps/* character devices (MIG).
  returned: always
  type: list
  elements: str
proc_devices:
  description: Char device majors by driver name from /proc/devices (nvidia, nvidia-uvm, ...).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import guard
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_nodes import scan


def main() -> None:
    module = AnsibleModule(
        argument_spec={"dev_root": {"type": "path", "default": "/dev"}, "try_open": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )
    guard.run(module, "nvidia_device_facts", _run)


def _run(module: AnsibleModule) -> None:
    module.exit_json(changed=False, **scan(module.params["dev_root"], module.params["try_open"]))


if __name__ == "__main__":
    main()
