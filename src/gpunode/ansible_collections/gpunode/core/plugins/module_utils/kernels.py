"""Kernel state of a Proxmox GPU host, from files only (no commands), under a root prefix.

What breaks GPU hosts most often: ``apt full-upgrade`` brings a new proxmox-kernel for which the
NVIDIA DKMS module is not built (headers missing, a failed DKMS build, a driver too old for the
kernel) and at the next reboot every GPU is gone. This reads, per installed kernel, whether it
boots next, whether its headers are installed and whether the pinned driver's module is built
for it, plus the log of the last failed DKMS build. The findings are computed on the controller,
by gpunode.stages.host.findings.check_kernels.

Plain Python like nvidia_host.py: it runs as module_utils on the Proxmox host and as a script,
and every path is read under a root prefix so tests can point it at a tree of files.
"""

from __future__ import annotations

import os
import re

# proxmox-boot-tool's pin files. proxmox-kernel-helper, src/proxmox-boot/functions lines 8-9:
#   PINNED_KERNEL_CONF="/etc/kernel/proxmox-boot-pin"   (proxmox-boot-tool kernel pin <ver>)
#   NEXT_BOOT_PIN="/etc/kernel/next-boot-pin"           (proxmox-boot-tool kernel pin <ver> --next-boot)
# and src/proxmox-boot/zz-proxmox-boot lines 100-103: the next-boot pin, when present, replaces
# the pinned kernel as the boot default. Both are read as their first line (get_first_line).
# (Read in the jiangcuo/proxmox-kernel-helper mirror of Proxmox's repository, commit 7007b33.)
PIN_FILE = "/etc/kernel/proxmox-boot-pin"
NEXT_BOOT_PIN_FILE = "/etc/kernel/next-boot-pin"

# DKMS 3.0.10 (Debian 12), github dell/dkms tag v3.0.10, file dkms.in:
#   line 2297: dkms_tree="/var/lib/dkms"; line 2299: install_tree="/lib/modules"
#   line 1361: a module is added when $dkms_tree/<module>/<version>/source is a link or a folder
#              (line 877 makes it a link to $source_tree/<module>-<version>, /usr/src)
#   lines 1054, 1110-1116: a built module is kept at
#              $dkms_tree/<module>/<version>/<kernel>/<arch>/module/<name>.ko[.gz|.xz|.zst]
#   line 389:  on Debian the module is installed to /lib/modules/<kernel>/updates/dkms
#   lines 1056, 1068: the build writes $dkms_tree/<module>/<version>/build/make.log, whose first
#              line is  "DKMS make.log for $module-$module_version for kernel $kernelver ($arch)";
#              on success it is moved into <kernel>/<arch>/log/ (line 1090) and build/ is removed
#              (line 1134), so a make.log left in build/ is the last build's, a failed one.
DKMS_TREE = "/var/lib/dkms"
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
MAKE_LOG_HEADER = re.compile(r"^DKMS make\.log for (?P<name>\S+) for kernel (?P<kernel>\S+) \((?P<arch>[^)]+)\)")
MAKE_LOG_LINES = 5

# Headers packages that provide /lib/modules/<kernel>/build, newest naming first: Proxmox VE 8
# (proxmox-headers-K), older Proxmox VE (pve-headers-K), Debian (linux-headers-K).
HEADERS_PREFIXES = ("proxmox-headers-", "pve-headers-", "linux-headers-")


def _path(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(root: str, path: str) -> str | None:
    try:
        with open(_path(root, path), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _first_line(root: str, path: str) -> str | None:
    text = _read(root, path)
    if text is None:
        return None
    lines = text.splitlines()
    return (lines[0].strip() if lines else "") or None


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key for kernel versions, like ``sort -V``: digit runs compare as numbers, the rest as
    text, so 6.8.12-10-pve > 6.8.12-9-pve > 6.8.8-2-pve."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.findall(r"\d+|\D+", version))


def installed_kernels(root: str) -> list[str]:
    """Every K with /boot/vmlinuz-K: what a kernel image package leaves (a /lib/modules/K alone
    can be just a headers package's ``build`` link). proxmox-boot-tool refuses to pin a kernel
    without /boot/vmlinuz-K (proxmox-kernel-helper, src/bin/proxmox-boot-tool line 525)."""
    folder = _path(root, "/boot")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [name[len("vmlinuz-"):] for name in names if name.startswith("vmlinuz-") and len(name) > len("vmlinuz-")]
    return sorted(found, key=version_key)


def dpkg_installed(root: str) -> dict[str, str]:
    """Installed packages (name -> version) from dpkg's status file: want install or hold, no
    error flag, state installed (``Status: install ok installed``; a held package reads
    ``hold ok installed``). Half-installed, unpacked or removed (config-files) ones are left out."""
    text = _read(root, "/var/lib/dpkg/status") or ""
    out: dict[str, str] = {}
    for block in re.split(r"\n\s*\n", text):
        package = re.search(r"^Package: (\S+)\s*$", block, re.M)
        status = re.search(r"^Status: (\S+) (\S+) (\S+)\s*$", block, re.M)
        if not package or not status:
            continue
        want, flag, state = status.groups()
        if want in ("install", "hold") and flag == "ok" and state == "installed":
            version = re.search(r"^Version: (\S+)\s*$", block, re.M)
            out[package.group(1)] = version.group(1) if version else ""
    return out


def headers_wanted(kernel: str) -> str:
    return f"proxmox-headers-{kernel}" if kernel.endswith("-pve") else f"linux-headers-{kernel}"


def _module_file(root: str, folder: str, module: str) -> str | None:
    for suffix in MODULE_SUFFIXES:
        if os.path.exists(_path(root, f"{folder}/{module}{suffix}")):
            return f"{folder}/{module}{suffix}"
    return None


def dkms_registered(root: str, module: str, version: str) -> bool:
    source = _path(root, f"{DKMS_TREE}/{module}/{version}/source")
    # A link counts even when it dangles under the root prefix: it points at /usr/src on the host.
    return bool(version) and (os.path.islink(source) or os.path.isdir(source))


def dkms_versions(root: str, module: str) -> list[str]:
    """Versions of ``module`` registered with DKMS, oldest first."""
    try:
        names = os.listdir(_path(root, f"{DKMS_TREE}/{module}"))
    except OSError:
        return []
    return sorted((name for name in names if not name.startswith("kernel-") and dkms_registered(root, module, name)),
                  key=version_key)


def dkms_built(root: str, module: str, version: str, kernel: str) -> bool:
    base = f"{DKMS_TREE}/{module}/{version}/{kernel}"
    try:
        arches = sorted(os.listdir(_path(root, base)))  # x86_64 on a Proxmox VE host
    except OSError:
        return False
    return any(_module_file(root, f"{base}/{arch}/module", module) for arch in arches)


def module_installed(root: str, module: str, kernel: str) -> bool:
    return _module_file(root, f"/lib/modules/{kernel}/updates/dkms", module) is not None


def make_log(root: str, module: str, version: str) -> tuple[str | None, list[str]] | None:
    """The make.log a failed DKMS build left: (the kernel it names, its first error lines: lines
    containing "error", at most 5; else its last 5 lines)."""
    text = _read(root, f"{DKMS_TREE}/{module}/{version}/build/make.log")
    if not text:
        return None
    lines = [line.rstrip() for line in text.splitlines()]
    header = MAKE_LOG_HEADER.match(lines[0]) if lines else None
    body = [line for line in lines[1:] if line.strip()]
    errors = [line.strip() for line in body if "error" in line.lower()]
    return (header.group("kernel") if header else None,
            errors[:MAKE_LOG_LINES] if errors else [line.strip() for line in body[-MAKE_LOG_LINES:]])


def boot_kernel(root: str, installed: list[str]) -> tuple[str | None, str, str | None]:
    """(kernel that boots next, why, the pin that decides it or None). A pin naming a kernel that
    is no longer installed has no boot entry: the bootloader falls back to its default, the newest."""
    for path, reason in ((NEXT_BOOT_PIN_FILE, "pinned for the next boot"), (PIN_FILE, "pinned")):
        pin = _first_line(root, path)
        if pin and pin in installed:
            return pin, reason, pin
    return (installed[-1] if installed else None), "newest installed", None


def gather(config_root: str = "/", runtime_root: str | None = None, module: str = "nvidia",
           version: str = "") -> dict[str, object]:
    """Kernel facts. /boot, /etc, dpkg, DKMS and /lib/modules under ``config_root``; the running
    kernel (/proc) under ``runtime_root`` (default: config_root). ``version`` is the driver the
    host file pins; empty: the newest version registered with DKMS."""
    runtime_root = config_root if runtime_root is None else runtime_root
    if not version:
        registered_versions = dkms_versions(config_root, module)
        version = registered_versions[-1] if registered_versions else ""
    running = _first_line(runtime_root, "/proc/sys/kernel/osrelease")
    installed = installed_kernels(config_root)
    boot, boot_reason, pinned = boot_kernel(config_root, installed)
    packages = dpkg_installed(config_root)
    failed = make_log(config_root, module, version) if version else None
    kernels: list[dict[str, object]] = []
    for kernel in installed:
        headers = next((prefix + kernel for prefix in HEADERS_PREFIXES if prefix + kernel in packages), None)
        built = bool(version) and dkms_built(config_root, module, version, kernel)
        if module_installed(config_root, module, kernel):
            state = "installed"
        elif built:
            state = "built"
        else:
            state = "missing"
        build_failed = failed is not None and failed[0] == kernel and not built
        kernels.append({
            "version": kernel,
            "running": kernel == running,
            "boots_next": kernel == boot,
            "headers": headers is not None,
            "headers_package": headers,
            "headers_wanted": headers_wanted(kernel),
            "module": state,
            "build_failed": build_failed,
            "make_log": list(failed[1]) if failed is not None and build_failed else [],
        })
    return {
        "running": running,
        "boot": boot,
        "boot_reason": boot_reason,
        "pinned": pinned,
        "module": module,
        "version": version,
        "dkms_registered": dkms_registered(config_root, module, version),
        "kernels": kernels,
    }
