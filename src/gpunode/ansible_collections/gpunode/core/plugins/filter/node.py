"""Filters for the node stage; the logic lives in gpunode.node.userspace and gpunode.node.cdi (plain, tested Python).

They run on the controller, with gpunode's own interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpunode.core.plugins.plugin_utils.gpunode_package import filters_needing_gpunode

try:
    from gpunode.node.cdi import spec_json
    from gpunode.node.userspace import installed_versions, module_version, needs_install
    from gpunode.serve.docker_run import choose_gpu_handoff
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    installed_versions = module_version = needs_install = spec_json = None  # type: ignore[assignment]
    choose_gpu_handoff = None  # type: ignore[assignment]
else:
    IMPORT_ERROR = None


def docker_handoff_args(cdi_spec: dict[str, Any], gpus: Any, docker_info: dict[str, Any]) -> list[str]:
    """`docker run` arguments for the host-driver hand-off, chosen as serve chooses it."""
    return choose_gpu_handoff(docker_info, gpus, local=False, cdi_spec=cdi_spec).cli_args()


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return filters_needing_gpunode({
            "module_version": module_version,
            "userspace_versions": installed_versions,
            "userspace_needs_install": needs_install,
            # (scan, tree, root='/usr/local/nvidia', gpus='all', mig=False) -> CDI spec JSON text
            "cdi_spec": spec_json,
            "docker_handoff_args": docker_handoff_args,
        }, IMPORT_ERROR)
