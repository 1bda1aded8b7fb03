"""Release NVIDIA GPUs from vfio-pci: drop their PCI ids from modprobe options and kernel command lines.

Text in, text out, so the host stage can slurp a file, pass it through here, and write it back
only when something changed (idempotent by construction).
"""

from __future__ import annotations

import re

BACKUP_SUFFIX = ".gpunode-orig"  # the file as it was before gpunode's first change (modprobe reads *.conf only)
# The line gpunode puts above what it changed in someone else's modprobe file (it holds no "ids=",
# so a re-run finds nothing left to release and changes nothing).
MODPROBE_MARK = f"# gpunode released NVIDIA GPUs from vfio-pci below; the original is kept as *.conf{BACKUP_SUFFIX}\n"
NVIDIA_ID = re.compile(r"^10de:[0-9a-fA-F]{4}$")
MODPROBE_IDS = re.compile(r"^(\s*options\s+vfio[-_]pci\s+.*?\bids=)(\S+)(.*)$")
CMDLINE_IDS = re.compile(r"(\s?)\bvfio[-_]pci\.ids=(\S+?)(?=[\s\"']|$)")


def _keep(ids: str) -> list[str]:
    return [i for i in ids.split(",") if i and not NVIDIA_ID.match(i)]


def release_modprobe(text: str) -> str:
    """Remove NVIDIA ids from `options vfio-pci ids=...` lines; drop a line left with no ids."""
    out = []
    for line in text.splitlines(keepends=True):
        match = MODPROBE_IDS.match(line.rstrip("\n"))
        if not match:
            out.append(line)
            continue
        kept = _keep(match.group(2))
        if kept == match.group(2).split(","):
            out.append(line)
            continue
        out.append(MODPROBE_MARK)
        if kept:
            out.append(f"{match.group(1)}{','.join(kept)}{match.group(3)}" + ("\n" if line.endswith("\n") else ""))
        elif match.group(3).strip():
            out.append(f"{match.group(1).replace(' ids=', ' ').rstrip()}{match.group(3)}" + ("\n" if line.endswith("\n") else ""))
    return "".join(out)


def release_cmdline(text: str) -> str:
    """Remove NVIDIA ids from `vfio-pci.ids=` on a kernel command line (grub or /etc/kernel/cmdline)."""
    def replace(match: re.Match[str]) -> str:
        kept = _keep(match.group(2))
        return f"{match.group(1)}vfio-pci.ids={','.join(kept)}" if kept else ""
    return CMDLINE_IDS.sub(replace, text)


def nvidia_ids_in(text: str) -> list[str]:
    """NVIDIA ids still handed to vfio-pci in a file's text."""
    found = []
    for match in re.finditer(r"\bids=(\S+)", text):
        found.extend(i for i in match.group(1).strip("\"'").split(",") if NVIDIA_ID.match(i))
    return found
