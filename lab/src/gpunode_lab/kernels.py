"""The lab host's kernels, as an `apt full-upgrade` leaves a Proxmox host: the state the host
stage's kernel repair works on, made of real parts where this machine can run them.

- Real: Debian's dkms, gcc and kernel headers (linux-headers-<K> from Debian's archive), and a
  DKMS entry named like NVIDIA's (nvidia/580.159.04) whose module is a small stand-in
  (tests/fixtures/host/dkms-standin) that DKMS builds for real against those headers.
- Stand-in: the kernels themselves (/boot/vmlinuz-<K> and an empty /lib/modules/<K>): the lab host
  is a container on this machine's kernel, which it cannot boot.

Which kernels: the three newest that Debian's archive has headers for at the first `lab up`
(bookworm's ABIs, and the cloud and rt flavours of the newest, which sort after it), kept in
CHOSEN so later runs and the tests agree. `lab up` leaves the oldest with headers and the module
built, and the middle one, newer, with neither (a kernel update whose module was never built: the
next boot would lose the GPUs); the first provision repairs it. The newest is what the recovery
tests install.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

CHOSEN = Path("/var/lib/gpunode-lab/kernels.json")
HEADERS = re.compile(r"^linux-headers-(\d+\.\d+\.\d+-\d+-(?:amd64|cloud-amd64|rt-amd64))$")
MODULE, VERSION = "nvidia", "580.159.04"
BUILD_PACKAGES = ("dkms", "gcc", "make", "kmod")


def _on_host(command: str, timeout: float = 900, host: str | None = None) -> subprocess.CompletedProcess[str]:
    from gpunode_lab.containers import ssh_command

    return subprocess.run(ssh_command(command, host=host or lab_host()), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def lab_host() -> str:
    from gpunode_lab.contract import HOST_CONTAINER_IP

    return HOST_CONTAINER_IP


def _must(command: str, what: str, timeout: float = 900, host: str | None = None) -> str:
    from gpunode_lab.contract import LabError

    done = _on_host(command, timeout, host)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise LabError(f"{what} in the lab host failed (exit {done.returncode}): {' | '.join(tail)}")
    return done.stdout


def _version_key(version: str) -> object:
    """The host stage's own order (module_utils/kernels.py), so "newest" means the same here."""
    from gpunode.ground.paths import MODULE_UTILS

    spec = importlib.util.spec_from_file_location("gpunode_kernels", MODULE_UTILS / "kernels.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.version_key(version)


def kernels() -> tuple[str, str, str]:
    """(built at lab up, left without headers or module, installed by the recovery tests)."""
    if CHOSEN.is_file():
        return tuple(json.loads(CHOSEN.read_text()))  # type: ignore[return-value]
    listed = _must("apt-get update -q >/dev/null && apt-cache search --names-only '^linux-headers-'",
                   "listing Debian's kernel headers", timeout=600)
    found = sorted({m.group(1) for line in listed.splitlines() if (m := HEADERS.match(line.split(" - ")[0]))},
                   key=_version_key)
    if len(found) < 3:
        from gpunode_lab.contract import LabError

        raise LabError(f"Debian's archive offers headers for {len(found)} kernels ({', '.join(found) or 'none'}); "
                       "the lab needs three")
    chosen = tuple(found[-3:])
    CHOSEN.parent.mkdir(parents=True, exist_ok=True)
    CHOSEN.write_text(json.dumps(chosen) + "\n")
    return chosen  # type: ignore[return-value]


def install_kernel(kernel: str) -> str:
    """What a kernel image package leaves that the host stage reads: /boot/vmlinuz-K and
    /lib/modules/K (stand-ins: the lab cannot boot them)."""
    return (f"test -e /boot/vmlinuz-{kernel} || {{ mkdir -p /boot /lib/modules/{kernel} && "
            f"echo 'gpunode lab stand-in for Linux {kernel} (never booted)' > /boot/vmlinuz-{kernel} && "
            f"touch /lib/modules/{kernel}/modules.order /lib/modules/{kernel}/modules.builtin; }}")


def remove_kernel(kernel: str) -> str:
    return (f"dkms remove -m {MODULE} -v {VERSION} -k {kernel} >/dev/null 2>&1; "
            f"apt-get purge -y linux-headers-{kernel} >/dev/null 2>&1; "
            f"rm -rf /boot/vmlinuz-{kernel} /lib/modules/{kernel}; true")


def ensure(progress: Callable[[str], None], host: str | None = None, repair: bool = True) -> bool:
    """Bring a lab host's kernels to the state the module docstring describes; idempotent (the
    newer kernel is never broken again once a provision has repaired it). ``host``: the lab host's
    address (default the first site's); without ``repair`` only the kernel with its module built
    (the fleet's second host: a converged host, not the repair's scenario)."""
    from gpunode_lab.contract import DKMS_STANDIN

    built, broken, _newest = kernels()
    state = _must(f"dpkg-query -W -f='${{Status}}\\n' {' '.join(BUILD_PACKAGES)} 2>/dev/null | grep -c 'ok installed'; "
                  f"test -e /boot/vmlinuz-{built} && echo kernel; "
                  f"test -e /var/lib/dkms/{MODULE}/{VERSION}/source && echo registered; "
                  f"ls /lib/modules/{built}/updates/dkms/{MODULE}.ko* >/dev/null 2>&1 && echo built; true",
                  "reading the kernel state", host=host)
    lines = state.split()
    changed = False
    if not lines or lines[0] != str(len(BUILD_PACKAGES)) or "kernel" not in lines:
        progress(f"kernels: installing dkms, gcc and linux-headers-{built} in the lab host {host or lab_host()} (Debian's, real)")
        _must("export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null && apt-get install -y -q "
              f"--no-install-recommends {' '.join(BUILD_PACKAGES)} linux-headers-{built} >/dev/null",
              "installing dkms and kernel headers", timeout=1500, host=host)
        _must(" && ".join(install_kernel(k) for k in ((built, broken) if repair else (built,))),
              "laying out the stand-in kernels", host=host)
        changed = True
    if "registered" not in lines:
        source = DKMS_STANDIN
        files = {name: (source / name).read_text() for name in ("dkms.conf", "Makefile", "nvidia.c")}
        script = f"mkdir -p /usr/src/{MODULE}-{VERSION} && " + " && ".join(
            f"printf %s {shlex.quote(text)} > /usr/src/{MODULE}-{VERSION}/{name}" for name, text in files.items())
        _must(script + f" && dkms add -m {MODULE} -v {VERSION}", "registering the stand-in DKMS module", host=host)
        changed = True
    if "built" not in lines:
        progress(f"kernels: dkms builds the stand-in {MODULE}/{VERSION} for {built} (for real)")
        _must(f"dkms install -m {MODULE} -v {VERSION} -k {built}", f"dkms install for {built}", host=host)
        changed = True
    if repair:
        progress(f"kernels: {built} (module built), {broken} "
                 f"({'installed without headers or module' if changed else 'as the last provision left it'})")
    else:
        progress(f"kernels: {built} (module built) in {host}")
    return changed
