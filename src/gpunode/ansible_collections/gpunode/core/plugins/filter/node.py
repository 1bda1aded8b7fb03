"""Filters for the node stage; the logic lives in gpunode.node.userspace (plain, tested Python)."""

from __future__ import annotations

from gpunode.node.userspace import installed_versions, module_version, needs_install


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "module_version": module_version,
            "userspace_versions": installed_versions,
            "userspace_needs_install": needs_install,
        }
