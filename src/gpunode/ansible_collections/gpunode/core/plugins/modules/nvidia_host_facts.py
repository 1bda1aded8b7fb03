#!/usr/bin/python
"""Ansible module: read-only facts of a GPU host (driver, HMM, PCI binding, IOMMU, device nodes).

Reads files only: runtime state (/proc, /sys, /run) under ``facts_root`` (``/`` on a real host;
the lab points it at readings recorded on a real GPU machine), configuration (/etc, dpkg) under
``/``, and the device nodes under ``dev_root``.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_host import gather
from ansible_collections.gpunode.core.plugins.module_utils.nvidia_nodes import scan

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
    try:
        main()
    except Exception as exc:  # a module's failure is a message, never a traceback (README, exit codes)
        import json
        import sys
        import traceback

        print(json.dumps({"failed": True, "msg": f"{Path(__file__).stem}: unexpected {type(exc).__name__}: {exc}",
                          "exception": traceback.format_exc()}))
        sys.exit(1)
