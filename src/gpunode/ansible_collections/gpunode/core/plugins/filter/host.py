"""Filters for the host stage; the logic lives in gpunode.host.vfio (plain, tested Python).

They run on the controller, where gpunode's own interpreter has the package. Elsewhere (a plain
ansible-core, ansible-test's import check) the plugin still loads and each filter says what it
needs when used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from gpunode.host.vfio import nvidia_ids_in, release_cmdline, release_modprobe
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    nvidia_ids_in = release_cmdline = release_modprobe = None  # type: ignore[assignment]
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
            "release_modprobe": _needs_gpunode(release_modprobe),
            "release_cmdline": _needs_gpunode(release_cmdline),
            "nvidia_vfio_ids": _needs_gpunode(nvidia_ids_in),
        }
