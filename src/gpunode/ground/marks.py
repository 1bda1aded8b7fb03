"""gpunode's mark on what it made in Proxmox (README "What gpunode owns"): the container's tag and
the first line of its description. derive writes them into the container config; the container
stage reads them to tell gpunode's container from an operator's."""

from __future__ import annotations

OWNER_TAG = "gpunode"
MARK_PREFIX = "gpunode:"  # the description line gpunode writes starts with this


def mark_line(host: str) -> str:
    """The description line of a container gpunode made for ``host``."""
    return f"{MARK_PREFIX} made for host {host} by gpunode provision; the '{OWNER_TAG}' tag marks it as gpunode's"
