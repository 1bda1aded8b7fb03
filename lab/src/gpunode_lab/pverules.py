"""What real Proxmox VE refuses and fakepve 0.5.0 lets through: the lab's Proxmox refuses it too.

Each rule is written from pve-container's and pve-common's own source (proxmox/pve-container at
94f5585, proxmox/pve-common at its head of the same day) and names the file and line it follows.
gpunode_lab.pve applies them to the requests its fakepve serves:

- a devN path must be ``/dev/...`` without ``.``/``..`` components (``verify_lxc_dev_string``);
- an mpN's ``mp=`` must have no ``.``/``..`` components (``verify_lxc_mp_string``);
- a top-level boolean parameter is ``0`` or ``1`` (JSON true/false in a JSON body), never ``True``;
- every devN set on create or update names a device node on the Proxmox host
  (``get_device_mode_and_rdev``: ``Device ... does not exist``, ``... is not a device``);
- ``ssh-public-keys`` passes ``ssh-keygen -l -f`` line by line, the real ssh-keygen as Proxmox
  runs it (``validate_ssh_public_keys``).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# pve-container src/PVE/LXC/Config.pm verify_lxc_dev_string, lines 1063-1077: no /./ or /../ (or
# at the end), and /dev/ at the start.
_DEV_DOTS = re.compile(r"/\.\.?(?:/|$)")
# verify_lxc_mp_string, lines 982-998: no /./ or /../, no /. or /.. at the end, no ../ at the start.
_MP_BAD = (re.compile(r"/\.\.?/"), re.compile(r"/\.\.?$"), re.compile(r"^\.\./"))


def dev_path_problem(path: str) -> str | None:
    """pve-lxc-dev-string's refusal of ``path`` (without the trailing newline), or None."""
    if _DEV_DOTS.search(path) or not path.startswith("/dev/"):
        return f"{path} is not a valid device path"
    return None


def mp_path_problem(path: str) -> str | None:
    """pve-lxc-mp-string's refusal of ``path``, or None."""
    if any(pattern.search(path) for pattern in _MP_BAD):
        return f"{path} contains illegal character sequences"
    return None


def boolean_problems(parameters: Mapping[str, Any] | None, values: Mapping[str, Any],
                     json_body: bool) -> dict[str, str]:
    """Top-level boolean parameters that are not 0 or 1 (pve-common src/PVE/JSONSchema.pm
    check_type, lines 1243-1260: the spellings true/yes/on are commented out there; a JSON
    boolean passes only as a JSON value). Property strings (features=nesting=1) are not this:
    parse_property_string takes every spelling (line 1116)."""
    declared = (parameters or {}).get("properties", {})
    errors: dict[str, str] = {}
    for name, value in values.items():
        if declared.get(name, {}).get("type") != "boolean":
            continue
        if isinstance(value, bool) and json_body:
            continue
        text = str(value)
        if text not in ("0", "1"):
            errors[name] = f"type check ('boolean') failed - got '{text}'"
    return errors


def device_problem(host_root: Path, path: str) -> str | None:
    """pve-container src/PVE/LXC/Tools.pm get_device_mode_and_rdev, lines 157-168: the devN's
    path stat()ed on the Proxmox host (here under ``host_root``), which must be a block or
    character device. Proxmox's text with its newline."""
    try:
        mode = os.stat(f"{host_root}{path}").st_mode
    except FileNotFoundError:
        return f"Device {path} does not exist\n"
    except OSError:
        return f"Error accessing device {path}\n"
    if not (stat.S_ISBLK(mode) or stat.S_ISCHR(mode)):
        return f"{path} is not a device\n"
    return None


def ssh_keys_problem(text: str) -> str | None:
    """pve-common src/PVE/Tools.pm validate_ssh_public_keys, lines 1104-1120: each line that is
    not blank (Perl's ``/^\\s*$/``) written to a file of its own and read by ``ssh-keygen -l -f``;
    one failure is the 500 ``SSH public key validation error``. The real ssh-keygen runs here."""
    for line in text.split("\n"):
        if re.fullmatch(r"[ \t\n\r\f\v]*", line):
            continue
        with tempfile.NamedTemporaryFile("wb", prefix="labpve-key-") as handle:
            handle.write(line.encode("utf-8", "surrogateescape"))
            handle.flush()
            try:
                ok = subprocess.run(["ssh-keygen", "-l", "-f", handle.name], stdin=subprocess.DEVNULL,
                                    capture_output=True, timeout=30, check=False).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        if not ok:
            return "SSH public key validation error\n"
    return None
