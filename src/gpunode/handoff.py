"""The host-driver hand-off's names, one definition for the package: where the host keeps its
driver trees, where the container and the server container see one, and the CDI spec the node
stage writes. (The roles' defaults and module_utils/driver_tree.py carry their own: they run on
the targets, without the package.)"""

TREE_ROOT = "/var/lib/gpunode/nvidia"  # on the Proxmox host: one tree per driver version
MOUNT_POINT = "/usr/local/nvidia"  # in the LXC container (an mpN mount point) and in Docker containers
CDI_KIND = "gpunode.io/gpu"  # gpunode's own vendor: never NVIDIA's nvidia.com/gpu
CDI_SPEC_FILE = "/etc/cdi/gpunode.json"  # on the node, written by the node stage
