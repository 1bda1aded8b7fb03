"""Filters for the node stage; the logic lives in gpunode.node.userspace (plain, tested Python).

They run on the controller, where gpunode's own interpreter has the package. Elsewhere (a plain
ansible-core, ansible-test's import check) the plugin still loads and each filter says what it
needs when used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from gpunode.node.userspace import installed_versions, module_version, needs_install
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    installed_versions = module_version = needs_install = None  # type: ignore[assignment]
else:
    IMPORT_ERROR = None


def _needs_gpunode(function: Any) -> Callable[..., Any]:
    if IMPORT_ERROR is None:
        return function

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise AnsibleFilterError(f"gpunode.core filters need the gpunode Python package ({IMPORT_ERROR}): "
                                 "run them through gpunode or its interpreter")
    return missing


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "module_version": _needs_gpunode(module_version),
            "userspace_versions": _needs_gpunode(installed_versions),
            "userspace_needs_install": _needs_gpunode(needs_install),
        }
