"""Filters for the node stage; the logic lives in gpunode.node.userspace (plain, tested Python).

They run on the controller, with gpunode's own interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpunode.core.plugins.plugin_utils.gpunode_package import filters_needing_gpunode

try:
    from gpunode.node.userspace import installed_versions, module_version, needs_install
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    installed_versions = module_version = needs_install = None  # type: ignore[assignment]
else:
    IMPORT_ERROR = None


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return filters_needing_gpunode({
            "module_version": module_version,
            "userspace_versions": installed_versions,
            "userspace_needs_install": needs_install,
        }, IMPORT_ERROR)
