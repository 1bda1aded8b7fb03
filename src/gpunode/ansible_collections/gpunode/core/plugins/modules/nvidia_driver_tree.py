#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_driver_tree
short_description: Build (or prune) the host's NVIDIA user-space tree that containers mount read-only
description:
  - With O(state=present), makes C(<dest>/<version>/lib64) hold every library of the loaded driver
    version that the host's ld cache lists (a file ending in C(.so.<version>)), each under its
    SONAME (C(libcuda.so.1), C(libnvidia-ml.so.1), ...), and C(<dest>/<version>/bin) the driver's
    tools found on the host (nvidia-smi, nvidia-debugdump, nvidia-persistenced, MPS).
  - Files are hard links where the tree and the driver share a file system, else copies. A
    manifest C(gpunode-tree.json) marks the tree as gpunode's and lists what it holds.
  - A new driver version gets a new tree; older trees stay until O(state=pruned) removes those not
    in O(keep) (gpunode keeps the loaded version and every version a container still mounts).
  - Idempotent, and supports check mode (reports what it would change).
version_added: 0.2.0
author:
  - gpunode developers (!UNKNOWN)
options:
  state:
    description: V(present) builds the tree of the loaded driver; V(pruned) removes gpunode's trees not in O(keep).
    type: str
    choices: [present, pruned]
    default: present
  facts_root:
    description:
      - Where the host's files are read (C(/) on a real host; the lab points it at a layout recorded
        on a GPU machine). The driver version comes from C(sys/module/nvidia/version) under it.
    type: path
    default: /
  ld_cache:
    description: The ld cache to list the libraries from; default C(etc/ld.so.cache) under O(facts_root).
    type: path
  dest:
    description: The folder holding one tree per driver version.
    type: path
    default: /var/lib/gpunode/nvidia
  keep:
    description: With O(state=pruned), the versions to keep.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Build the tree of the loaded driver
  gpunode.core.nvidia_driver_tree:
  register: tree

- name: Remove trees no container mounts any more
  gpunode.core.nvidia_driver_tree:
    state: pruned
    keep: ["{{ tree.version }}", "580.95.05"]
"""

RETURN = r"""
version:
  description: The loaded driver's version (O(state=present)).
  returned: when state is present
  type: str
  sample: 580.159.04
path:
  description: The tree's folder.
  returned: when state is present
  type: str
  sample: /var/lib/gpunode/nvidia/580.159.04
libraries:
  description: The SONAMEs in C(lib64).
  returned: when state is present
  type: list
  elements: str
binaries:
  description: The tools in C(bin).
  returned: when state is present
  type: list
  elements: str
changes:
  description: What changed (or would, in check mode), one line each.
  returned: always
  type: list
  elements: str
removed:
  description: Versions whose trees were removed (O(state=pruned)).
  returned: when state is pruned
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import driver_tree, guard


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["present", "pruned"], "default": "present"},
            "facts_root": {"type": "path", "default": "/"},
            "ld_cache": {"type": "path"},
            "dest": {"type": "path", "default": driver_tree.TREE_ROOT},
            "keep": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    guard.run(module, "nvidia_driver_tree", _run)


def _run(module: AnsibleModule) -> None:
    params = module.params
    if params["state"] == "pruned":
        removed = driver_tree.prune(params["keep"], params["dest"], module.check_mode)
        module.exit_json(changed=bool(removed), removed=removed, changes=[f"removed the tree of {v}" for v in removed])
    root = params["facts_root"]
    version = driver_tree.read_version(root)
    if not version:
        module.fail_json(msg=f"no NVIDIA module is loaded ({os.path.join(root, driver_tree.VERSION_FILE.lstrip('/'))} "
                             "is absent): load the driver on the host first; there is no user space to share")
    cache = params["ld_cache"] or os.path.join(root, driver_tree.LD_CACHE.lstrip("/"))
    ldconfig = module.get_bin_path("ldconfig", required=True, opt_dirs=["/sbin", "/usr/sbin"])
    rc, out, err = module.run_command([ldconfig, "-p", "-C", cache])
    if rc != 0:
        module.fail_json(msg=f"ldconfig -p -C {cache} failed (exit {rc}): {err.strip() or out.strip()}")
    tree_plan = driver_tree.plan(driver_tree.parse_ldconfig(out), version, root)
    if not tree_plan["libraries"]:
        module.fail_json(msg=f"the ld cache {cache} lists no library of driver {version} (no *.so.{version}): "
                             "run ldconfig on the host, or reinstall the driver")
    missing = [name for name in ("libcuda.so.1", "libnvidia-ml.so.1") if name not in tree_plan["libraries"]]  # type: ignore[operator]
    if missing:
        module.fail_json(msg=f"driver {version}'s user space lacks {', '.join(missing)} in {cache}: CUDA cannot run "
                             "from it; reinstall the driver")
    changes = driver_tree.build(tree_plan, root, params["dest"], module.check_mode)
    module.exit_json(changed=bool(changes), changes=changes, version=version,
                     path=os.path.join(params["dest"], version),
                     libraries=sorted(tree_plan["libraries"]), binaries=sorted(tree_plan["binaries"]))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
