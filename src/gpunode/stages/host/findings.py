"""The host stage's preflight: named findings, each with its fix, from gathered host facts.

Pure functions over the facts that playbooks/module_utils/nvidia_host.py gathers (and that
tests/fixtures/host/ recorded on a real GPU machine); check_kernels over module_utils/kernels.py's
facts (the "kernels" key: will the NVIDIA DKMS module be there after the next reboot).
``blocking`` findings stop the stage before it changes anything; the others are fixed by the
stage itself or are advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpunode.ground.finding import FAIL, OK, WARN, Finding
from gpunode.ground.nvidia import CONTROL_NODES, MIN_DRIVER_SM120

# The keys the Ansible module (gpu_host_findings) returns a finding under: its code as name, its
# severity (ok, warn, fail) as status, its message as detail.
KEYS = {"code": "name", "severity": "status", "message": "detail", "fix": "fix", "blocking": "blocking"}


@dataclass(frozen=True)
class Expectations:
    driver_version: str
    open_module: bool = True
    disable_hmm: bool = True
    release_vfio: bool = True
    persistenced: bool = True
    installer: bool = False  # an installer (url+sha256 or local file) is configured
    pin_kernel: bool = False  # prepare.pin_kernel: the stage may pin a kernel that has the module


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def check_os(facts: dict[str, Any]) -> Finding:
    os_info = facts.get("os") or {}
    name = os_info.get("PRETTY_NAME", "unknown OS")
    pve = facts.get("pve_manager")
    if pve:
        major = _version_tuple(pve)[:1]
        status = OK if major and major[0] >= 8 else WARN
        return Finding("os", status, f"{name}, Proxmox VE {pve}",
                       fix="" if status == OK else "devN passthrough needs Proxmox VE 8.1 or newer: upgrade the host")
    return Finding("os", WARN, f"{name}; pve-manager not installed (not a Proxmox VE host?)",
                   fix="run gpunode against a Proxmox VE 8.1+ host")


def check_gpus(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    gpus = facts.get("gpus") or []
    if not gpus:
        return [Finding("gpus", FAIL, "no NVIDIA GPU on the PCI bus",
                        fix="check the cards are seated and powered; `lspci -d 10de:` must list them", blocking=True)]
    found = [Finding("gpus", OK, f"{len(gpus)} NVIDIA GPU(s): " + ", ".join(
        f"{g['bus_id']} ({g.get('device_id')}, driver {g.get('driver') or 'none'})" for g in gpus))]
    on_vfio = [g["bus_id"] for g in gpus if g.get("driver") == "vfio-pci"]
    unbound = [g["bus_id"] for g in gpus if not g.get("driver")]
    if on_vfio:
        found.append(Finding(
            "gpu_binding", FAIL, f"{len(on_vfio)} GPU(s) bound to vfio-pci (left from VM passthrough): {', '.join(on_vfio)}",
            fix="the host stage removes their ids from /etc/modprobe.d and the kernel command line and rebuilds the "
            "initramfs (prepare.release_vfio); then reboot" if expect.release_vfio else
            "set prepare.release_vfio: true, or release them by hand, then reboot",
            blocking=not expect.release_vfio))
    if unbound:
        found.append(Finding("gpu_binding", FAIL, f"no driver bound to {', '.join(unbound)}",
                             fix="load the NVIDIA driver (modprobe nvidia) or install it (driver.installer)",
                             blocking=not expect.installer))
    if not on_vfio and not unbound:
        found.append(Finding("gpu_binding", OK, "every GPU is bound to nvidia"))
    return found


def check_driver(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    driver = facts.get("driver") or {}
    if not driver.get("loaded"):
        return [Finding("driver", FAIL, "the NVIDIA kernel module is not loaded",
                        fix=f"install driver {expect.driver_version} (open kernel module): set driver.installer",
                        blocking=not expect.installer)]
    version = str(driver.get("version") or "")
    out = []
    if _version_tuple(version)[:1] and _version_tuple(version)[0] < MIN_DRIVER_SM120:
        out.append(Finding("driver", FAIL, f"driver {version} is older than {MIN_DRIVER_SM120}: SM120 cannot run",
                           fix=f"install {expect.driver_version}", blocking=not expect.installer))
    elif version != expect.driver_version:
        out.append(Finding("driver", FAIL, f"driver {version} loaded, host file pins {expect.driver_version}",
                           fix=f"install {expect.driver_version} (driver.installer) or pin {version} in the host file",
                           blocking=not expect.installer))
    else:
        out.append(Finding("driver", OK, f"driver {version}"))
    if expect.open_module and not driver.get("open"):
        out.append(Finding("open_module", FAIL, "the proprietary kernel module is loaded; Blackwell needs the open one",
                           fix="reinstall the driver with --kernel-module-type=open", blocking=True))
    else:
        out.append(Finding("open_module", OK, "open kernel module" if driver.get("open") else "proprietary module"))
    return out


def check_iommu(facts: dict[str, Any]) -> Finding:
    kernel = facts.get("kernel") or {}
    mode = kernel.get("iommu")
    enabled = kernel.get("intel_iommu") == "on" or kernel.get("amd_iommu") == "on"
    if mode == "pt":
        return Finding("iommu", OK, "iommu=pt: DMA between GPUs is not translated")
    if enabled:
        return Finding("iommu", WARN, "IOMMU on in translated mode: P2P traffic goes through the root complex (slow, "
                       "or hangs)", fix="add iommu=pt to the kernel command line (and disable ACS on PCIe switches)")
    return Finding("iommu", OK, "IOMMU not enabled on the command line (P2P is not translated)")


def check_hmm(facts: dict[str, Any], expect: Expectations) -> Finding:
    uvm = facts.get("uvm") or {}
    if not uvm.get("loaded"):
        return Finding("hmm", WARN, "nvidia_uvm is not loaded (no CUDA process yet?)",
                       fix="the host stage sets nvidia-modprobe -u -c=0 at boot")
    live = uvm.get("uvm_disable_hmm")
    if live == "Y":
        return Finding("hmm", OK, "uvm_disable_hmm=Y")
    return Finding("hmm", FAIL, f"uvm_disable_hmm={live}: with the open module on some kernels cuInit fails with "
                   "error 3 (CUDA_ERROR_NOT_INITIALIZED) while nvidia-smi works",
                   fix="options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d (prepare.disable_hmm), then reload "
                   "nvidia_uvm or reboot", blocking=False)


def check_persistenced(facts: dict[str, Any]) -> Finding:
    state = facts.get("persistenced") or {}
    if state.get("running"):
        return Finding("persistenced", OK, "nvidia-persistenced running")
    if not state.get("installed"):
        return Finding("persistenced", WARN, "nvidia-persistenced not installed",
                       fix="it ships with the driver: install the driver's user space on the host")
    return Finding("persistenced", WARN, "nvidia-persistenced installed but not running",
                   fix="the host stage enables and starts it (prepare.persistenced)")


def check_nodes(facts: dict[str, Any]) -> Finding:
    devices = (facts.get("devices") or {}).get("devices") or {}
    gpus = (facts.get("devices") or {}).get("gpus") or []
    missing = [p for p in CONTROL_NODES if p not in devices]
    if not gpus or missing:
        return Finding("device_nodes", FAIL, f"missing: {', '.join(missing + ([] if gpus else ['/dev/nvidiaN']))}",
                       fix="nvidia-uvm nodes appear once something loads the module: the host stage runs "
                       "nvidia-modprobe -u -c=0 at boot")
    return Finding("device_nodes", OK, f"{len(gpus)} GPU node(s), nvidiactl and the nvidia-uvm pair present")


def _has_module(kernel: dict[str, Any]) -> bool:
    return kernel.get("module") in ("installed", "built")


def check_kernels(kernels: dict[str, Any], pin_kernel: bool) -> list[Finding]:
    """Will the GPUs survive the next reboot? From module_utils/kernels.py's facts: the kernel
    that boots next must have the pinned driver's DKMS module; a failed DKMS build (a driver too
    old for the kernel) blocks unless the stage may pin a kernel that has the module."""
    version = kernels.get("version") or "(none registered)"
    listed = list(kernels.get("kernels") or [])
    boot = kernels.get("boot")
    if not listed:
        return [Finding("kernel_module", WARN, "no kernel image in /boot: cannot tell which kernel boots next",
                        fix="run the host stage against the Proxmox VE host itself (not a container)")]
    with_module = [k["version"] for k in listed if _has_module(k)]  # sorted oldest first
    pin_to = with_module[-1] if with_module else None
    found: list[Finding] = []
    for kernel in sorted(listed, key=lambda k: not k.get("boots_next")):  # the one that boots next first
        name = kernel["version"]
        if kernel.get("boots_next"):
            found.append(_boot_kernel_module(kernels, kernel, version, pin_kernel, pin_to))
        elif kernel.get("module") == "missing":
            found.append(Finding(
                "kernel_module", WARN, f"module {version} is not built for {name} (installed, does not boot next)",
                fix=f"build it before booting {name}: dkms autoinstall -k {name}" + (
                    "" if kernel.get("headers") else f" (needs {kernel.get('headers_wanted')})")))
        else:
            found.append(Finding("kernel_module", OK, f"module {version} built for {name}"))
    for kernel in listed:
        if not kernel.get("headers"):
            found.append(Finding(
                "kernel_headers", FAIL, f"no headers package for {kernel['version']}: DKMS cannot build "
                f"{kernels.get('module') or 'nvidia'} {version} for it",
                fix=f"the host stage installs {kernel.get('headers_wanted')}"))
    for kernel in listed:
        if kernel.get("build_failed"):
            found.extend(_failed_build(kernel, listed, version, boot, pin_kernel, pin_to))
    return found


def _boot_kernel_module(kernels: dict[str, Any], kernel: dict[str, Any], version: str, pin_kernel: bool,
                        pin_to: str | None) -> Finding:
    name = kernel["version"]
    if kernel.get("module") == "installed":
        return Finding("kernel_module", OK, f"module {version} built for {name} (boots next)")
    if kernel.get("module") == "built":
        return Finding("kernel_module", WARN, f"module {version} built for {name} (boots next) but not installed "
                       f"into /lib/modules/{name}", fix=f"the host stage installs it: dkms autoinstall -k {name}")
    detail = (f"module {version} is not built for {name}, the kernel that boots next "
              f"({kernels.get('boot_reason') or 'newest installed'}): GPUs will be gone after the next reboot")
    if not kernels.get("dkms_registered"):
        return Finding("kernel_module", FAIL, detail + f"; DKMS has no {kernels.get('module') or 'nvidia'}/{version} "
                       "to build it from", fix=f"install driver {kernels.get('version') or '(the pinned one)'} "
                       "with --dkms", blocking=True)
    if kernel.get("build_failed"):  # rebuilding fails the same way; dkms_build says whether it blocks
        return Finding("kernel_module", FAIL, detail, fix=_pin_fix(name, version, pin_kernel, pin_to))
    headers = "" if kernel.get("headers") else f"installs {kernel.get('headers_wanted')} and "
    return Finding("kernel_module", FAIL, detail, fix=f"the host stage {headers}builds it: dkms autoinstall -k {name}")


def _pin_fix(name: str, version: str, pin_kernel: bool, pin_to: str | None) -> str:
    if pin_to is None:
        return f"install a driver that supports {name} (no installed kernel has module {version} to pin)"
    if pin_kernel:
        return (f"the host stage pins {pin_to} with proxmox-boot-tool (prepare.pin_kernel); install a driver "
                f"that supports {name} to boot it")
    return (f"set prepare.pin_kernel so the host stage pins {pin_to} with proxmox-boot-tool, or install a driver "
            f"that supports {name}")


def _failed_build(kernel: dict[str, Any], listed: list[dict[str, Any]], version: str, boot: str | None,
                  pin_kernel: bool, pin_to: str | None) -> list[Finding]:
    name = kernel["version"]
    log = "; ".join(kernel.get("make_log") or []) or "make.log is empty"
    detail = f"the DKMS build of {version} for {name} failed: {log}"
    if name != boot:
        build = Finding("dkms_build", FAIL, detail + f" ({name} does not boot next)",
                        fix=f"install a driver that supports {name} before booting it")
    else:  # the next reboot loses the GPUs unless the stage may pin a kernel that has the module
        build = Finding("dkms_build", FAIL, detail, fix=_pin_fix(name, version, pin_kernel, pin_to),
                        blocking=pin_to is None or not pin_kernel)
    # The usual cause: a kernel newer than the driver supports (symbols it uses were removed).
    # The facts list the kernels oldest first (module_utils/kernels.py sorts them like sort -V).
    position = [k["version"] for k in listed].index(name)
    older = [k["version"] for k in listed[:position] if _has_module(k)]
    if not older:
        return [build]
    support = Finding("kernel_support", FAIL, f"kernel {name} is newer than driver {version} supports "
                      f"(its DKMS build failed; {older[-1]} has the module)",
                      fix=f"install a driver release that supports {name}, or keep booting {older[-1]}")
    return [build, support]


def evaluate(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    found = [
        check_os(facts),
        *check_gpus(facts, expect),
        *check_driver(facts, expect),
        check_iommu(facts),
        check_hmm(facts, expect),
        check_persistenced(facts),
        check_nodes(facts),
    ]
    if "kernels" in facts:
        found.extend(check_kernels(facts["kernels"], expect.pin_kernel))
    return found


def as_dicts(findings: list[Finding]) -> list[dict[str, Any]]:
    """The findings as the Ansible module returns them (``KEYS``; no fix is "")."""
    return [{**finding.as_dict(KEYS), "fix": finding.fix or ""} for finding in findings]
