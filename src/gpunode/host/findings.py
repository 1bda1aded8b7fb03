"""The host stage's preflight: named findings, each with its fix, from gathered host facts.

Pure functions over the facts that playbooks/module_utils/nvidia_host.py gathers (and that
tests/fixtures/host/ recorded on a real GPU machine). ``blocking`` findings stop the stage before
it changes anything; the others are fixed by the stage itself or are advice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MIN_DRIVER = 570

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""
    blocking: bool = False

    def line(self) -> str:
        text = f"{self.status.upper():4} {self.name}: {self.detail}"
        return text + (f" -> fix: {self.fix}" if self.fix and self.status != OK else "")


@dataclass(frozen=True)
class Expectations:
    driver_version: str
    open_module: bool = True
    disable_hmm: bool = True
    release_vfio: bool = True
    persistenced: bool = True
    installer: bool = False  # an installer (url+sha256 or local file) is configured


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
                       "" if status == OK else "devN passthrough needs Proxmox VE 8.1 or newer: upgrade the host")
    return Finding("os", WARN, f"{name}; pve-manager not installed (not a Proxmox VE host?)",
                   "run gpunode against a Proxmox VE 8.1+ host")


def check_gpus(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    gpus = facts.get("gpus") or []
    if not gpus:
        return [Finding("gpus", FAIL, "no NVIDIA GPU on the PCI bus",
                        "check the cards are seated and powered; `lspci -d 10de:` must list them", blocking=True)]
    found = [Finding("gpus", OK, f"{len(gpus)} NVIDIA GPU(s): " + ", ".join(
        f"{g['bus_id']} ({g.get('device_id')}, driver {g.get('driver') or 'none'})" for g in gpus))]
    on_vfio = [g["bus_id"] for g in gpus if g.get("driver") == "vfio-pci"]
    unbound = [g["bus_id"] for g in gpus if not g.get("driver")]
    if on_vfio:
        found.append(Finding(
            "gpu_binding", FAIL, f"{len(on_vfio)} GPU(s) bound to vfio-pci (left from VM passthrough): {', '.join(on_vfio)}",
            "the host stage removes their ids from /etc/modprobe.d and the kernel command line and rebuilds the "
            "initramfs (prepare.release_vfio); then reboot" if expect.release_vfio else
            "set prepare.release_vfio: true, or release them by hand, then reboot",
            blocking=not expect.release_vfio))
    if unbound:
        found.append(Finding("gpu_binding", FAIL, f"no driver bound to {', '.join(unbound)}",
                             "load the NVIDIA driver (modprobe nvidia) or install it (driver.installer)",
                             blocking=not expect.installer))
    if not on_vfio and not unbound:
        found.append(Finding("gpu_binding", OK, "every GPU is bound to nvidia"))
    return found


def check_driver(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    driver = facts.get("driver") or {}
    if not driver.get("loaded"):
        return [Finding("driver", FAIL, "the NVIDIA kernel module is not loaded",
                        f"install driver {expect.driver_version} (open kernel module): set driver.installer",
                        blocking=not expect.installer)]
    version = str(driver.get("version") or "")
    out = []
    if _version_tuple(version)[:1] and _version_tuple(version)[0] < MIN_DRIVER:
        out.append(Finding("driver", FAIL, f"driver {version} is older than {MIN_DRIVER}: SM120 cannot run",
                           f"install {expect.driver_version}", blocking=not expect.installer))
    elif version != expect.driver_version:
        out.append(Finding("driver", FAIL, f"driver {version} loaded, host file pins {expect.driver_version}",
                           f"install {expect.driver_version} (driver.installer) or pin {version} in the host file",
                           blocking=not expect.installer))
    else:
        out.append(Finding("driver", OK, f"driver {version}"))
    if expect.open_module and not driver.get("open"):
        out.append(Finding("open_module", FAIL, "the proprietary kernel module is loaded; Blackwell needs the open one",
                           "reinstall the driver with --kernel-module-type=open", blocking=True))
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
                       "or hangs)", "add iommu=pt to the kernel command line (and disable ACS on PCIe switches)")
    return Finding("iommu", OK, "IOMMU not enabled on the command line (P2P is not translated)")


def check_hmm(facts: dict[str, Any], expect: Expectations) -> Finding:
    uvm = facts.get("uvm") or {}
    if not uvm.get("loaded"):
        return Finding("hmm", WARN, "nvidia_uvm is not loaded (no CUDA process yet?)",
                       "the host stage sets nvidia-modprobe -u -c=0 at boot")
    live = uvm.get("uvm_disable_hmm")
    if live == "Y":
        return Finding("hmm", OK, "uvm_disable_hmm=Y")
    return Finding("hmm", FAIL, f"uvm_disable_hmm={live}: with the open module on some kernels cuInit fails with "
                   "error 3 (CUDA_ERROR_NOT_INITIALIZED) while nvidia-smi works",
                   "options nvidia_uvm uvm_disable_hmm=1 in /etc/modprobe.d (prepare.disable_hmm), then reload "
                   "nvidia_uvm or reboot", blocking=False)


def check_persistenced(facts: dict[str, Any]) -> Finding:
    state = facts.get("persistenced") or {}
    if state.get("running"):
        return Finding("persistenced", OK, "nvidia-persistenced running")
    if not state.get("installed"):
        return Finding("persistenced", WARN, "nvidia-persistenced not installed",
                       "it ships with the driver: install the driver's user space on the host")
    return Finding("persistenced", WARN, "nvidia-persistenced installed but not running",
                   "the host stage enables and starts it (prepare.persistenced)")


def check_nodes(facts: dict[str, Any]) -> Finding:
    devices = (facts.get("devices") or {}).get("devices") or {}
    gpus = (facts.get("devices") or {}).get("gpus") or []
    missing = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if p not in devices]
    if not gpus or missing:
        return Finding("device_nodes", FAIL, f"missing: {', '.join(missing + ([] if gpus else ['/dev/nvidiaN']))}",
                       "nvidia-uvm nodes appear once something loads the module: the host stage runs "
                       "nvidia-modprobe -u -c=0 at boot")
    return Finding("device_nodes", OK, f"{len(gpus)} GPU node(s), nvidiactl and the nvidia-uvm pair present")


def evaluate(facts: dict[str, Any], expect: Expectations) -> list[Finding]:
    return [
        check_os(facts),
        *check_gpus(facts, expect),
        *check_driver(facts, expect),
        check_iommu(facts),
        check_hmm(facts, expect),
        check_persistenced(facts),
        check_nodes(facts),
    ]


def as_dicts(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(finding) for finding in findings]
