"""The container the unit tests converge against the in-process fakepve, and their connection to it."""

from __future__ import annotations

from typing import Any

from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection

NODE = "pve1"
TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"


def ct_config(**overrides: Any) -> dict[str, Any]:
    """gpunode's container 200 on node pve1, as the container stage sends it (devices aside)."""
    return {"vmid": 200, "hostname": "glm5", "ostemplate": TEMPLATE, "rootfs": "local-lvm:8", "cores": 4,
            "memory": 4096, "swap": 0, "net0": "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1",
            "features": "nesting=1,keyctl=1", "unprivileged": 0, "onboot": 1, "tags": lxc.OWNER_TAG,
            "description": lxc.mark_line(NODE), **overrides}


def connection(url: str, cafile: str) -> Connection:
    """root@pam with fakepve's password, fast backoff, a short task wait."""
    return Connection(url=url, node=NODE, password="secret", ca_file=cafile, backoff_s=0.01, task_timeout_s=10)
