#!/usr/bin/python
"""Ansible module: read-only facts of a GPU host (driver, HMM, PCI binding, IOMMU, device nodes).

Reads files only: runtime state (/proc, /sys, /run) under ``facts_root`` (``/`` on a real host;
the lab points it at readings recorded on a real GPU machine), configuration (/etc, dpkg) under
``/``, and the device nodes under ``dev_root``.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nvidia_host import gather
from ansible.module_utils.nvidia_nodes import scan

DOCUMENTATION = r"""
module: nvidia_host_facts
short_description: Read a GPU host's NVIDIA driver, HMM, PCI, IOMMU and device-node state
options:
  facts_root: {type: path, default: /, description: prefix for /proc, /sys and /etc reads}
  dev_root: {type: path, default: /dev, description: where the device nodes are}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"facts_root": {"type": "path", "default": "/"}, "dev_root": {"type": "path", "default": "/dev"}},
        supports_check_mode=True,
    )
    facts = gather(module.params["facts_root"], config_root="/")
    facts["devices"] = scan(module.params["dev_root"], try_open=False)
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
