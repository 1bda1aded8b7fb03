"""After the host stage: which kernel to pin, and whether the host is safe to reboot (the kernel
that boots next has the NVIDIA module). Plain functions over module_utils/kernels.py's facts."""

from __future__ import annotations

from typing import Any


def pin_candidate(kernels: dict[str, Any]) -> str | None:
    """The newest kernel the module is installed for, when the one that boots next has none."""
    rows = kernels.get("kernels") or []
    if not any(k["boots_next"] and k["module"] != "installed" for k in rows):
        return None
    ready = [k["version"] for k in rows if k["module"] == "installed"]  # rows are sorted oldest first
    return ready[-1] if ready else None


def reboot_safety(kernels: dict[str, Any], pinned: str | None = None) -> str:
    """One line for the recap: "safe to reboot: ..." or "NOT safe to reboot: ..."."""
    if pinned:
        return f"safe to reboot: pinned {pinned}, which has the NVIDIA module"
    boot = [k for k in kernels.get("kernels") or [] if k["boots_next"]]
    if not boot:
        return "no installed kernel found (/boot/vmlinuz-*)"
    if boot[0]["module"] == "installed":
        return f"safe to reboot: {boot[0]['version']} boots next and has the NVIDIA module"
    return (f"NOT safe to reboot: {boot[0]['version']} boots next and has no NVIDIA module {kernels.get('version')} "
            "(the GPUs would be gone)")
