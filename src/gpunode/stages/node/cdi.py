"""A Container Device Interface (CDI) spec that hands NVIDIA GPUs to Docker with no NVIDIA runtime.

Docker 25+ with CDI enabled reads specs from /etc/cdi and /var/run/cdi, and
`docker run --device gpunode.io/gpu=all` then needs no NVIDIA runtime. The driver's user space is
already laid out under <root>/{lib64,bin} with SONAME file names, so the spec is only device
nodes and read-only bind mounts: no hooks (no ldconfig, no symlinks) and no env.

Inputs are the device scan from module_utils/nvidia_nodes.py (scan()) and the tree's manifest
(<root>/gpunode-tree.json: {"version", "libraries", "binaries"}). Plain Python, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

from gpunode.catalogue import handoff

# 0.5.0 is the first version that allows a device name starting with a digit ("0", "1", ...).
CDI_VERSION = "0.5.0"
# Our own vendor: never collides with a spec NVIDIA's toolkit may have written as nvidia.com/gpu.
KIND = handoff.CDI_KIND
ROOT = handoff.MOUNT_POINT

GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
REQUIRED_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm")
OPTIONAL_CONTROL = ("/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
CAPS_PREFIX = "/dev/nvidia-caps/"
DEFAULT_MODE = 0o666
# What nvidia-ctk uses for driver files: read-only, and nothing on them can become a device or setuid.
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")

Gpus: TypeAlias = Literal["all"] | list[int]


def _devices(scan: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    devices = scan.get("devices")
    if not isinstance(devices, Mapping):
        raise TypeError("the device scan has no 'devices' mapping")
    return devices


def _node(path: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One CDI deviceNode; major/minor from the scan, except nvidia-uvm's (dynamic)."""
    if not entry.get("char"):
        raise ValueError(f"{path} is not a character device")
    mode = entry.get("mode")
    try:
        # The scan writes the mode as oct() text ("0o666"); CDI's fileMode is a number (Go os.FileMode).
        file_mode = int(str(mode), 8) if mode is not None else DEFAULT_MODE
    except ValueError:
        file_mode = DEFAULT_MODE
    if path.startswith("/dev/nvidia-uvm"):
        # nvidia-uvm's major is given out at each boot: left to the runtime, which reads it from
        # the node when the spec names none (a spec written before a reboot stays right).
        return {"path": path, "type": "c", "fileMode": file_mode}
    return {
        "path": path,
        "type": "c",
        "major": int(entry["major"]),
        "minor": int(entry["minor"]),
        "fileMode": file_mode,
    }


def _selected_gpus(devices: Mapping[str, Mapping[str, Any]], gpus: Gpus) -> list[int]:
    present = sorted(int(m.group(1)) for path in devices if (m := GPU_NODE.match(path)))
    if gpus == "all":
        if not present:
            raise ValueError("the device scan has no GPU nodes (/dev/nvidiaN)")
        return present
    if isinstance(gpus, str) or not gpus:
        raise ValueError(f"gpus must be 'all' or a non-empty list of GPU numbers, not {gpus!r}")
    wanted = sorted(set(gpus))
    missing = [f"/dev/nvidia{n}" for n in wanted if n not in present]
    if missing:
        raise ValueError(f"GPU device node missing from the scan: {', '.join(missing)}")
    return wanted


def _file_names(tree: Mapping[str, Any], key: str) -> list[str]:
    """Sorted, unique file names from the manifest; a name must not reach outside its folder."""
    names = tree.get(key) or []
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"the tree manifest's {key!r} is not a list of file names")
    result = set()
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"the tree manifest's {key!r} holds a bad file name: {name!r}")
        result.add(name)
    return sorted(result)


def _mount(path: str) -> dict[str, Any]:
    # Same path on both sides: the files sit where the image's LD_LIBRARY_PATH/PATH expect them.
    return {"hostPath": path, "containerPath": path, "options": list(MOUNT_OPTIONS)}


def spec(scan: Mapping[str, Any], tree: Mapping[str, Any], root: str = ROOT,
         gpus: Gpus = "all", mig: bool = False) -> dict[str, Any]:
    """The CDI spec: one device per selected GPU (named by its number), "all", and shared edits.

    Raises ValueError, one line naming what is missing, when a selected GPU, /dev/nvidiactl,
    /dev/nvidia-uvm or libcuda.so.1 is absent. Everything is sorted, so equal inputs give equal specs.
    """
    devices = _devices(scan)
    root = root.rstrip("/")
    if not root.startswith("/"):
        raise ValueError(f"root must be an absolute path, not {root!r}")

    selected = _selected_gpus(devices, gpus)
    gpu_nodes = [_node(f"/dev/nvidia{n}", devices[f"/dev/nvidia{n}"]) for n in selected]

    missing = [path for path in REQUIRED_CONTROL if path not in devices]
    if missing:
        raise ValueError(f"control device node missing from the scan: {', '.join(missing)}")
    control = [path for path in (*REQUIRED_CONTROL, *OPTIONAL_CONTROL) if path in devices]
    if mig:
        # MIG instances are reached through capability nodes; without MIG they are not needed.
        control += sorted(path for path in devices if path.startswith(CAPS_PREFIX))
    control_nodes = [_node(path, devices[path]) for path in control]

    libraries = _file_names(tree, "libraries")
    binaries = _file_names(tree, "binaries")
    if "libcuda.so.1" not in libraries:
        raise ValueError("the tree manifest has no libcuda.so.1")
    mounts = [_mount(f"{root}/lib64/{name}") for name in libraries]
    mounts += [_mount(f"{root}/bin/{name}") for name in binaries]

    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [
            *({"name": str(n), "containerEdits": {"deviceNodes": [node]}} for n, node in zip(selected, gpu_nodes)),
            {"name": "all", "containerEdits": {"deviceNodes": [dict(node) for node in gpu_nodes]}},
        ],
        # Spec-level edits apply whenever any device of this spec is requested.
        "containerEdits": {"deviceNodes": control_nodes, "mounts": mounts},
    }


def dumps(cdi: Mapping[str, Any]) -> str:
    """JSON text for /etc/cdi/<name>.json: CDI's own field order kept (readable), indent 2, final newline."""
    return json.dumps(cdi, indent=2) + "\n"


def spec_json(scan: Mapping[str, Any], tree: Mapping[str, Any], root: str = ROOT,
              gpus: str | Iterable[int | str] = "all", mig: bool = False) -> str:
    """The cdi_spec filter: spec() as JSON text. Jinja may hand GPU numbers over as strings."""
    selected: Gpus
    if isinstance(gpus, str):
        if gpus != "all":
            raise ValueError(f"gpus must be 'all' or a list of GPU numbers, not {gpus!r}")
        selected = "all"
    else:
        selected = [int(n) for n in gpus]
    return dumps(spec(scan, tree, root=root, gpus=selected, mig=bool(mig)))
