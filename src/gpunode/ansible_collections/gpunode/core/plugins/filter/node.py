"""Filters for the node stage; the logic lives in gpunode.stages.node.userspace and gpunode.stages.node.cdi (plain, tested Python).

They run on the controller, with gpunode's own interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpunode.core.plugins.plugin_utils.gpunode_package import filters_needing_gpunode

try:
    from gpunode.catalogue import handoff
    from gpunode.stages.node.cdi import spec_json
    from gpunode.stages.node.userspace import installed_versions, module_version, needs_install
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    installed_versions = module_version = needs_install = spec_json = None  # type: ignore[assignment]
    handoff = None  # type: ignore[assignment]
else:
    IMPORT_ERROR = None


def docker_handoff_args(docker_info: dict[str, Any], gpus: Any, configured: str,
                        cdi_spec: dict[str, Any] | None = None) -> list[str]:
    """`docker run` arguments for the hand-off the host file configures, chosen as serve chooses it
    (gpunode.catalogue.handoff.choose): the probes start their containers like the server."""
    from ansible.errors import AnsibleFilterError

    try:
        return handoff.choose(docker_info, gpus, local=False, configured=configured, cdi_spec=cdi_spec).cli_args()
    except handoff.HandoffError as exc:
        raise AnsibleFilterError(str(exc)) from None


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
