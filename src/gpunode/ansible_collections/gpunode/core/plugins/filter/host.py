"""Filters for the host stage; the logic lives in gpunode.stages.host.vfio, .reboot and .fabric (plain,
tested Python).

They run on the controller, with gpunode's own interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpunode.core.plugins.plugin_utils.gpunode_package import filters_needing_gpunode

try:
    from gpunode.stages.host.fabric import acs_unit, edit_cmdline
    from gpunode.stages.host.reboot import pin_candidate, reboot_safety
    from gpunode.stages.host.vfio import nvidia_ids_in, release_cmdline, release_modprobe
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
    nvidia_ids_in = release_cmdline = release_modprobe = None  # type: ignore[assignment]
    pin_candidate = reboot_safety = None  # type: ignore[assignment]
    acs_unit = edit_cmdline = None  # type: ignore[assignment]
else:
    IMPORT_ERROR = None


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return filters_needing_gpunode({
            "release_modprobe": release_modprobe,
            "release_cmdline": release_cmdline,
            "nvidia_vfio_ids": nvidia_ids_in,
            "kernel_to_pin": pin_candidate,
            "reboot_safety": reboot_safety,
            "acs_unit": acs_unit,
            "host_cmdline": edit_cmdline,
        }, IMPORT_ERROR)
