"""NVIDIA facts the package uses, one definition each (ARCHITECTURE.md, "Where each fact lives").

What the targets need too lives in the collection's module_utils, which run there without this
package: the device nodes (nvidia_nodes.py) and the driver tree's paths (driver_tree.py); they are
read from there, not written again. The rest is defined here.
"""

from __future__ import annotations

from gpunode.ansible_collections.gpunode.core.plugins.module_utils import driver_tree as _tree
from gpunode.ansible_collections.gpunode.core.plugins.module_utils import nvidia_nodes as _nodes

GPU_MAJOR = _nodes.GPU_MAJOR
CONTROL_NODES: tuple[str, ...] = _nodes.CONTROL_NODES
OPTIONAL_NODES: tuple[str, ...] = _nodes.OPTIONAL_NODES
CAPS_DIR = _nodes.CAPS_DIR
DEV_MODE = _nodes.DEV_MODE
MINORS: dict[str, int] = _nodes.MINORS
UVM_NODES: tuple[str, ...] = _nodes.UVM_NODES

TREE_ROOT = _tree.TREE_ROOT  # on the Proxmox host: one driver tree per version
MOUNT_POINT = _tree.MOUNT_POINT  # in the LXC container (mpN) and in Docker containers
CDI_KIND = "gpunode.io/gpu"  # gpunode's own vendor: never NVIDIA's nvidia.com/gpu
CDI_DIR = "/etc/cdi"  # where Docker 25+ reads CDI specs (and /var/run/cdi)
CDI_SPEC_FILE = f"{CDI_DIR}/gpunode.json"  # on the node, written by the node stage

# Blackwell (SM120) needs R570 or newer and NVIDIA's open kernel module (FIELD-NOTES s2); a stack
# may need more (stack.yml driver_min: CUDA 13 needs 580).
MIN_DRIVER_SM120 = 570
