#!/usr/bin/python
"""Ansible module: list the NVIDIA device nodes of a machine with their major:minor.

Read-only, so it runs in check mode too. Used where nodes are discovered (the Proxmox host) and
where the hand-off is verified (inside the container).
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_nodes import scan

DOCUMENTATION = r"""
module: nvidia_device_facts
short_description: List /dev/nvidia* nodes with type, major, minor and whether they open
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

RETURN = r"""
devices:
  description: Map of node path (as /dev/...) to char, major, minor, mode, open_error (null when it opened).
  type: dict
gpus:
  description: Paths of the /dev/nvidiaN GPU nodes, by minor number.
  type: list
caps:
  description: Paths of /dev/nvidia-caps/* nodes (MIG).
  type: list
proc_devices:
  description: Char device majors by driver name from /proc/devices (nvidia, nvidia-uvm, ...).
  type: dict
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"dev_root": {"type": "path", "default": "/dev"}, "try_open": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **scan(module.params["dev_root"], module.params["try_open"]))


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a module's failure is a message, never a traceback (README, exit codes)
        import json
        import sys
        import traceback

        print(json.dumps({"failed": True, "msg": f"{Path(__file__).stem}: unexpected {type(exc).__name__}: {exc}",
                          "exception": traceback.format_exc()}))
        sys.exit(1)
