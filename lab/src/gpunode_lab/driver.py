"""The lab's NVIDIA driver layout: the files a Proxmox host with driver 580.159.04 holds, named as
recorded on a real H200 (tests/fixtures/host/h200/driver, by record_driver.py), with stand-in
contents (the lab has no GPU), so the host stage's driver tree is built from a real layout.

- ``usr/lib/x86_64-linux-gnu``: every ``lib*.so.<version>`` file and the SONAME links that the real
  ``ldconfig`` made from the real files; each file says what it stands in for.
- ``etc/ld.so.cache``: the cache the real ldconfig wrote over those files (read with ldconfig -p).
- ``usr/bin/nvidia-smi``: prints what the real one printed; the other tools say they stand in.

``lay_out(fixture, root, version)`` may rename the version (a later driver, for the recovery test
"host driver upgraded"). This machine's ldconfig cannot make a cache from stand-ins (they are not
ELF), so the recorded cache is rewritten with the names changed in place, which is why the new
version must have the same length as the recorded one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LIB_DIR = "usr/lib/x86_64-linux-gnu"
BIN_DIR = "usr/bin"
STAND_IN = "gpunode lab stand-in for {name} (NVIDIA driver {version}; recorded on an H200, {size} bytes there)\n"


def _write(path: Path, data: bytes, mode: int) -> bool:
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data and (path.stat().st_mode & 0o777) == mode:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    tmp = path.with_name(path.name + ".lab-tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def _link(path: Path, target: str) -> bool:
    if path.is_symlink() and os.readlink(path) == target:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.symlink(target, path)
    return True


def smi_script(output: str) -> str:
    return "#!/bin/sh\n# gpunode lab stand-in: prints what nvidia-smi printed on the H200 the driver was recorded on\n" \
           f"cat <<'GPUNODE_EOF'\n{output.rstrip()}\nGPUNODE_EOF\n"


def lay_out(fixture: Path, root: Path, version: str | None = None) -> bool:
    """Write the recorded driver layout under ``root``; returns whether anything changed."""
    layout = json.loads((fixture / "layout.json").read_text())
    recorded = str(layout["version"])
    version = version or recorded
    if len(version) != len(recorded):
        raise ValueError(f"the lab renames driver {recorded} to a version of the same length, not {version!r} "
                         "(the recorded ld cache is rewritten in place)")

    def named(text: str) -> str:
        return text.replace(recorded, version)

    changed = False
    sizes = {row["name"]: row.get("size", 0) for row in layout["libraries"] if row["type"] == "file"}
    for row in layout["pve_layout"]:
        path = root / LIB_DIR / named(row["name"])
        if row["type"] == "link":
            changed |= _link(path, named(row["target"]))
        elif row["type"] == "file":
            text = STAND_IN.format(name=named(row["name"]), version=version, size=sizes.get(row["name"], "?"))
            changed |= _write(path, text.encode(), 0o755)
    cache = (fixture / "ld.so.cache").read_bytes().replace(recorded.encode(), version.encode())
    changed |= _write(root / "etc" / "ld.so.cache", cache, 0o644)
    smi = named((fixture / "nvidia-smi.txt").read_text())
    for row in layout["bin"]:
        name = row["name"]
        body = smi_script(smi) if name == "nvidia-smi" else \
            f"#!/bin/sh\necho 'gpunode lab stand-in for {name} (NVIDIA driver {version}): no GPU here' >&2\nexit 1\n"
        changed |= _write(root / BIN_DIR / name, body.encode(), 0o755)
    return changed
