"""Filters for the host stage; the logic lives in gpunode.host.vfio (plain, tested Python)."""

from __future__ import annotations

from gpunode.host.vfio import nvidia_ids_in, release_cmdline, release_modprobe


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "release_modprobe": release_modprobe,
            "release_cmdline": release_cmdline,
            "nvidia_vfio_ids": nvidia_ids_in,
        }
