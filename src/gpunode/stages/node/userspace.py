"""NVIDIA user space inside the container must match the host's kernel module exactly.

The container shares the host's kernel, so /proc/driver/nvidia/version inside it is the host
module's banner: the version is read there, never typed twice.
"""

from __future__ import annotations

import re

BANNER = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)")
NVML_LIB = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def module_version(banner: str) -> str:
    """The module version from /proc/driver/nvidia/version's text ('' when there is none)."""
    match = BANNER.search(banner or "")
    return match.group(1) if match else ""


def installed_versions(library_names: list[str]) -> list[str]:
    """User-space versions from libnvidia-ml.so.<version> file names, sorted, unique."""
    return sorted({m.group(1) for name in library_names if (m := NVML_LIB.match(name))})


def needs_install(module: str, installed: list[str]) -> bool:
    """True when the module is visible and the user space is missing, different, or mixed."""
    return bool(module) and installed != [module]
