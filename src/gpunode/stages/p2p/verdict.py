"""Readings and expectations in, findings, verdicts and an exit code out. Pure: no NVML, no CUDA.

Exit codes (gpunode.ground.exitcodes; also in the README and ``python3 -m gpunode.stages.p2p --help``):

- 0 pass: every GPU and every ordered pair met expectations;
- 1 fail: a pair below expectation, P2P unavailable, a copy's data wrong, a link downtrained under
  load, a measurement that failed or hung, or fewer GPUs than ``min_gpus``;
- 2 bad input: command-line or expectation values;
- 4 environment: no NVIDIA driver / NVML, no GPU, CUDA unusable (e.g. cuInit error 3, the HMM case),
  or PyTorch missing;
- 5 pass, pair checks not applicable: fewer than two GPUs visible, so nothing was said about P2P.

With ``required: false`` (host file ``p2p:``), P2P findings (unavailable, below expectation,
downtrained link) are reported as warnings and do not fail the check; wrong data and environment
problems always do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpunode.ground import exitcodes
from gpunode.stages.p2p import fabric as pcie_fabric
from gpunode.stages.p2p.findings import Finding, PairVerdict, gpu_name, pair_name
from gpunode.stages.p2p.measure import Bandwidth, DriverProbe, GpuMeasurements, Measurements, PairMeasurements
from gpunode.stages.p2p.topology import Gpu, HostFacts, PairTopology, Topology

# gpunode's exit codes (gpunode.ground.exitcodes: one number, one meaning, for every command), as p2p says them.
EXIT_PASS = exitcodes.OK
EXIT_FAIL = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_PAIRS_NOT_APPLICABLE = exitcodes.NOT_APPLICABLE
EXIT_ENVIRONMENT = exitcodes.ENVIRONMENT
EXIT_CODES: dict[int, str] = {
    EXIT_PASS: "pass: every GPU and every ordered pair met expectations",
    EXIT_FAIL: "fail: a pair or the node below expectation, P2P unavailable, wrong data, or a measurement failed",
    EXIT_BAD_INPUT: "bad input: command line or expectation values",
    EXIT_ENVIRONMENT: "environment: no driver/NVML, no GPU, CUDA unusable (e.g. HMM, cuInit error 3) or no PyTorch",
    EXIT_PAIRS_NOT_APPLICABLE: "pass, but pair checks not applicable: fewer than two GPUs, nothing said about P2P",
}
SYS_LEVEL = 50
HMM_FIX = ("on the HOST (containers share its kernel): add 'options nvidia_uvm uvm_disable_hmm=1' to a file in "
           "/etc/modprobe.d/, then reload nvidia_uvm (rmmod nvidia_uvm; modprobe nvidia_uvm) or reboot")
VM_CAUSE = ("this runs in a VM with the GPUs passed through: the VM sees a flattened virtual PCIe tree, so the driver "
            "cannot route peer-to-peer between GPUs and every all-reduce goes through host memory")
VM_FIX = ("serve from an LXC container on the Proxmox host instead (same kernel, real PCIe topology): that gave "
          "P2P back, ~53 GB/s within a NUMA node")
IOMMU_FIX = "boot the host with iommu=pt (or IOMMU off) and disable ACS on the PCIe switches/root ports"
SEVERE_THROTTLE = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}


@dataclass(frozen=True)
class Expectations:
    """Minimum unidirectional P2P bandwidth per pair class, decimal GB/s (host file ``p2p:``)."""

    same_numa_gbps: float = 45.0
    cross_numa_gbps: float = 35.0
    nvlink_gbps: float = 100.0
    required: bool = True
    min_gpus: int | None = None  # e.g. the server's TP size; None: the GPU count is not judged

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Expectations:
        """From a plain mapping such as the host file's ``p2p:`` section; raises ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown expectation key(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        expect = cls(**dict(data))
        problems = expect.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return expect

    def problems(self) -> list[str]:
        found = []
        for name in ("same_numa_gbps", "cross_numa_gbps", "nvlink_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                found.append(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(self.required, bool):
            found.append(f"required must be true or false, got {self.required!r}")
        if self.min_gpus is not None and (isinstance(self.min_gpus, bool) or not isinstance(self.min_gpus, int)
                                          or self.min_gpus < 1):
            found.append(f"min_gpus must be an integer >= 1, got {self.min_gpus!r}")
        return found

    def for_class(self, link_class: str) -> float:
        return {"nvlink": self.nvlink_gbps, "same_numa": self.same_numa_gbps,
                "cross_numa": self.cross_numa_gbps}[link_class]


@dataclass
class Verdict:
    status: str  # pass | fail | pass (pairs not applicable) | environment
    exit_code: int
    summary: str
    gpus_nvml: int
    gpus_measured: int
    pairs_applicable: bool
    pairs: list[PairVerdict]
    findings: list[Finding]


def numa_of(gpu: Gpu) -> int | None:
    """The GPU's NUMA node: NVML's id, else its one nearest memory node (VMs often lack the id)."""
    if gpu.numa_node is not None:
        return gpu.numa_node
    return gpu.numa_affinity[0] if len(gpu.numa_affinity) == 1 else None


def classify(pair: PairTopology, src: Gpu, dst: Gpu) -> str:
    """Which expectation applies: NVLink, same NUMA node, or across NUMA nodes."""
    if pair.nvlinks > 0 or pair.p2p_ok("nvlink"):
        return "nvlink"
    src_node, dst_node = numa_of(src), numa_of(dst)
    if src_node is not None and dst_node is not None:
        return "same_numa" if src_node == dst_node else "cross_numa"
    return "cross_numa" if pair.level == SYS_LEVEL else "same_numa"


def in_vm(topology: Topology) -> bool:
    return any(gpu.virtualization_mode in (1, 2) for gpu in topology.gpus)


# -- environment -------------------------------------------------------------------------------

def environment_finding(code: str, message: str, cause: str | None = None, fix: str | None = None) -> Finding:
    return Finding(code, "fail", subject="node", message=message, cause=cause, fix=fix, category="environment")


def driver_probe_findings(probe: DriverProbe, host: HostFacts) -> list[Finding]:
    """cuInit failing while NVML works: name the cause where it is known."""
    if probe.code == 0:
        return []
    uvm_disable_hmm = host.uvm_disable_hmm
    if probe.code is None:
        return [environment_finding("no-cuda-driver", f"CUDA driver library not found: {probe.name}",
                                    "the NVIDIA user-space driver is not installed in this container/image",
                                    "install the same driver version's user-space (--no-kernel-module)")]
    if probe.code == 3:
        return [environment_finding(
            "cuda-hmm", f"cuInit returned {probe.code} ({probe.name}) although the driver answers NVML",
            "HMM in nvidia_uvm (open kernel modules on this kernel) failed to initialise: dmesg shows "
            "'nvidia-uvm: ... devmem_alloc_pagemap ... request_free_mem_region() err -34'; "
            f"uvm_disable_hmm is {uvm_disable_hmm or 'unknown (nvidia_uvm not loaded?)'}",
            HMM_FIX)]
    if probe.code == 100:
        return [environment_finding("no-gpu", f"cuInit returned {probe.code} ({probe.name}): CUDA sees no GPU",
                                    "the GPU device nodes are not passed into this container, or CUDA_VISIBLE_DEVICES "
                                    "hides them", "pass /dev/nvidia* into the container (Proxmox devN entries)")]
    if not host.dev_nvidia_uvm:
        return [environment_finding("no-nvidia-uvm", f"cuInit returned {probe.code} ({probe.name}) and there is no "
                                    "/dev/nvidia-uvm here", "CUDA needs nvidia-uvm; its device nodes appear only once "
                                    "the module is loaded on the host",
                                    "on the host run 'nvidia-modprobe -u -c=0' (at boot), then pass /dev/nvidia-uvm "
                                    "and /dev/nvidia-uvm-tools into the container")]
    return [environment_finding("cuda-init", f"cuInit returned {probe.code} ({probe.name})",
                                "the CUDA driver cannot start here", "check dmesg and the driver versions "
                                "(container user-space must match the host's kernel module)")]


# -- per GPU -----------------------------------------------------------------------------------

def _virtualization_findings(topology: Topology, pairs_missing_p2p: bool) -> list[Finding]:
    findings = []
    for gpu in topology.gpus:
        if gpu.virtualization_mode not in (1, 2):
            continue
        several = len(topology.gpus) > 1
        if several and pairs_missing_p2p:
            severity, message = "fail", (f"{gpu_name(gpu.index)} runs in a VM ({gpu.virtualization}): "
                                         "P2P between GPUs is lost")
        elif several:
            severity, message = "warn", (f"{gpu_name(gpu.index)} runs in a VM ({gpu.virtualization}); P2P was "
                                         "nevertheless measured working")
        else:
            severity, message = "warn", (f"{gpu_name(gpu.index)} runs in a VM ({gpu.virtualization}): with more "
                                         "than one GPU, P2P between them will be lost here")
        findings.append(Finding("vm-passthrough", severity, subject=gpu_name(gpu.index), message=message,
                                cause=VM_CAUSE, fix=VM_FIX, category="p2p"))
    return findings


def downtrained(gpu: Gpu) -> str | None:
    """'Gen4 x8 under load, capable of Gen5 x16' when the link ran below its capability under load."""
    load, pcie = gpu.under_load, gpu.pcie
    if load is None or load.pcie_gen is None or load.pcie_width is None:
        return None
    if pcie.max_gen is None or pcie.max_width is None:
        return None
    if load.pcie_gen < pcie.max_gen or load.pcie_width < pcie.max_width:
        return (f"Gen{load.pcie_gen} x{load.pcie_width} under load, capable of "
                f"Gen{pcie.max_gen} x{pcie.max_width}")
    return None


def _gpu_findings(gpu: Gpu, measured: GpuMeasurements | None) -> list[Finding]:
    subject = gpu_name(gpu.index)
    findings: list[Finding] = []
    link = downtrained(gpu)
    if link:
        findings.append(Finding("downtrained-link", "fail", subject=subject, message=f"PCIe link downtrained: {link}",
                                cause="a riser, slot, BIOS link-speed setting or signal problem keeps the link below "
                                "its capability; every copy through it is slower",
                                fix="reseat the card / check the slot's BIOS PCIe speed setting and the riser",
                                category="p2p"))
    elif gpu.under_load is None:
        findings.append(Finding("link-idle-only", "info", subject=subject,
                                message="PCIe link read only at idle (no copy ran): the generation may read low at "
                                "idle", category="info"))
    load = gpu.under_load
    severe = sorted(set(load.clock_event_reasons) & SEVERE_THROTTLE) if load else []
    if severe:
        findings.append(Finding("throttled", "warn", subject=subject,
                                message=f"clocks held down during copies: {', '.join(severe)}",
                                cause="thermal or power limits", fix="check cooling and the power limit",
                                category="node"))
    if measured is None:
        return findings
    findings.extend(_placement_findings(gpu, measured))
    findings.extend(_host_copy_findings(subject, measured))
    return findings


def _placement_findings(gpu: Gpu, measured: GpuMeasurements) -> list[Finding]:
    if not measured.pinning.startswith("unpinned"):
        return []
    node = f"NUMA node {numa_of(gpu)}" if numa_of(gpu) is not None else "its NUMA node"
    return [Finding("numa-placement", "warn", subject=gpu_name(gpu.index),
                    message=f"measuring thread {measured.pinning}",
                    cause=f"this process may not run on {gpu_name(gpu.index)}'s local CPUs ({node}): host copies and "
                    "the server's CPU threads cross the socket interconnect",
                    fix=f"give the container cores on {node} (Proxmox: cores / cpuset of the container)",
                    category="node")]


def _host_copy_findings(subject: str, measured: GpuMeasurements) -> list[Finding]:
    findings = []
    for result in (measured.h2d, measured.d2h, measured.d2d, measured.h2d_latency, measured.d2h_latency,
                   measured.d2d_latency):
        if result is not None and not result.verified:
            findings.append(Finding("data-mismatch", "fail", subject=subject,
                                    message=f"{result.kind} copy {result.src}->{result.dst}: destination differs from "
                                    "the source pattern", cause="memory or DMA translation fault (IOMMU)",
                                    fix="check dmesg for IOMMU/Xid errors", category="data"))
    for name, error in measured.errors.items():
        findings.append(Finding("measurement-failed", "fail", subject=subject, message=f"{name}: {error}",
                                category="node"))
    return findings


# -- pairs -------------------------------------------------------------------------------------

P2P_REASON_CAUSES: dict[str, tuple[str, str]] = {
    "CHIPSET_NOT_SUPPORTED": ("the chipset/root complex does not allow P2P between these GPUs, or IOMMU/ACS "
                              "redirects it", IOMMU_FIX),
    "IOH_TOPOLOGY_NOT_SUPPORTED": ("the path between these GPUs crosses IO hubs that cannot carry P2P (often "
                                   "across sockets), or IOMMU/ACS redirects it", IOMMU_FIX),
    "DISABLED_BY_REGKEY": ("P2P is disabled by an NVIDIA driver registry key",
                           "remove the RM registry key (NVreg_RegistryDwords) from the nvidia module options"),
    "GPU_NOT_SUPPORTED": ("this GPU model does not support P2P", "use GPUs that support P2P"),
}


def _p2p_unavailable(pair: PairTopology, measured: PairMeasurements | None, topology: Topology) -> Finding | None:
    not_ok = {cap: pair.p2p_reason.get(cap, "?") for cap in ("read", "write") if not pair.p2p_ok(cap)}
    refused = measured is not None and measured.peer_access is False
    if not not_ok and not refused:
        return None
    if not_ok:
        detail = ", ".join(f"{cap}: {reason}" for cap, reason in not_ok.items())
        message = f"P2P unavailable (NVML {detail})"
    else:
        message = "P2P unavailable: CUDA refuses peer access although NVML reports it OK"
    reason = next(iter(not_ok.values()), "")
    if in_vm(topology):
        cause, fix = VM_CAUSE, VM_FIX
    else:
        cause, fix = P2P_REASON_CAUSES.get(reason, ("the platform does not route P2P between these GPUs "
                                                    "(IOMMU in translated mode or ACS are the usual reasons)",
                                                    IOMMU_FIX))
    return Finding("p2p-unavailable", "fail", subject=pair_name(pair.src, pair.dst), message=message, cause=cause,
                   fix=fix, category="p2p")


def likely_causes(pair: PairTopology, link_class: str, topology: Topology,
                  measured: PairMeasurements | None, gpus_measured: dict[int, GpuMeasurements]) -> list[str]:
    """Why a pair may be slow, most specific evidence first."""
    causes = []
    if in_vm(topology):
        causes.append(VM_CAUSE)
    for index in (pair.src, pair.dst):
        link = downtrained(topology.gpu(index))
        if link:
            causes.append(f"{gpu_name(index)} link downtrained ({link})")
    if measured is not None and measured.uni is not None and measured.uni.path == "staged":
        causes.append("no peer access: the copies were staged through host memory")
    host = topology.host
    if link_class != "nvlink" and pair.legend in ("PHB", "NODE", "SYS"):
        iommu_on = bool(host.iommu_groups) and not any("iommu=pt" in word or "iommu=off" in word
                                                       for word in host.iommu_cmdline)
        evidence = (f" (IOMMU groups: {host.iommu_groups}, kernel command line: "
                    f"{' '.join(host.iommu_cmdline) or 'no iommu= option'})" if iommu_on else "")
        causes.append(f"the path crosses the host bridge ({pair.legend}): with IOMMU in translated mode or ACS "
                      f"enabled, P2P goes through the root complex{evidence}")
    if link_class == "cross_numa":
        causes.append("the copies cross the CPU interconnect between sockets")
    for index in (pair.src, pair.dst):
        gm = gpus_measured.get(index)
        if gm is not None and gm.pinning.startswith("unpinned"):
            causes.append(f"wrong NUMA placement: {gpu_name(index)} measured {gm.pinning}")
    if not causes:
        causes.append("nothing in the NVML readings explains it: check IOMMU (iommu=pt) and ACS on the PCIe switches")
    return causes


def judge_pair(pair: PairTopology, topology: Topology, measured: PairMeasurements | None, expect: Expectations,
               gpus_measured: dict[int, GpuMeasurements]) -> tuple[PairVerdict, list[Finding]]:
    src, dst = topology.gpu(pair.src), topology.gpu(pair.dst)
    link_class = classify(pair, src, dst)
    expected = expect.for_class(link_class)
    uni = measured.uni if measured else None
    verdict = PairVerdict(
        src=pair.src, dst=pair.dst, link_class=link_class, legend=pair.legend, expected_gbps=expected,
        measured_gbps=uni.median_gbps if uni else None,
        bidir_gbps=measured.bidir.median_gbps if measured and measured.bidir else None,
        latency_us=measured.latency.median_us if measured and measured.latency else None,
        path=uni.path if uni else None, status="pass")
    subject = pair_name(pair.src, pair.dst)
    findings: list[Finding] = []
    unavailable = _p2p_unavailable(pair, measured, topology)
    if unavailable:
        findings.append(unavailable)
    if measured is None or uni is None:
        errors = "; ".join(f"{k}: {v}" for k, v in (measured.errors.items() if measured else []))
        findings.append(Finding("not-measured", "fail", subject=subject,
                                message=f"pair not measured{': ' + errors if errors else ''}", category="node"))
    else:
        findings.extend(_pair_measurement_findings(subject, measured, uni, expected, link_class,
                                                   likely_causes(pair, link_class, topology, measured, gpus_measured)))
    verdict.reasons = [f.code for f in findings if f.severity in ("fail", "warn")]
    failed = [f for f in findings if f.severity == "fail"]
    verdict.status = "fail" if failed else "pass"
    if measured is None or uni is None:
        verdict.status = "not measured"
    return verdict, findings


def _pair_measurement_findings(subject: str, measured: PairMeasurements, uni: Bandwidth, expected: float,
                               link_class: str, causes: list[str]) -> list[Finding]:
    findings = []
    for result in (measured.uni, measured.bidir, measured.latency):
        if result is not None and not result.verified:
            findings.append(Finding("data-mismatch", "fail", subject=subject,
                                    message=f"{result.kind} copy: destination differs from the source pattern",
                                    cause="IOMMU in translated mode or ACS redirecting P2P: copies complete but data "
                                    "is lost", fix=IOMMU_FIX, category="data"))
    if uni.median_gbps < expected:
        findings.append(Finding("below-expectation", "fail", subject=subject,
                                message=f"unidirectional {uni.median_gbps:.1f} GB/s < {expected:g} GB/s expected "
                                f"({link_class.replace('_', '-')}, path {uni.path})",
                                cause="; ".join(causes), category="p2p"))
    bidir = measured.bidir
    if bidir is not None and bidir.median_gbps <= uni.median_gbps:
        findings.append(Finding("bidir-no-overlap", "info", subject=subject,
                                message=f"bidirectional {bidir.median_gbps:.1f} GB/s is not above unidirectional "
                                f"{uni.median_gbps:.1f} GB/s: the two directions do not overlap", category="info"))
    for name, error in measured.errors.items():
        findings.append(Finding("measurement-failed", "fail", subject=subject, message=f"{name}: {error}",
                                category="node"))
    return findings


# -- node --------------------------------------------------------------------------------------

def _demote(findings: list[Finding], expect: Expectations) -> None:
    if expect.required:
        return
    for at, finding in enumerate(findings):
        if finding.category == "p2p" and finding.severity == "fail":
            findings[at] = replace(finding, severity="warn",
                                   message=finding.message + " (p2p.required is false: not failing)")


def exit_code_for(findings: list[Finding], pairs_applicable: bool) -> int:
    failing = [f for f in findings if f.severity == "fail"]
    if any(f.category == "environment" for f in failing):
        return EXIT_ENVIRONMENT
    if failing:
        return EXIT_FAIL
    return EXIT_PASS if pairs_applicable else EXIT_PAIRS_NOT_APPLICABLE


def judge(topology: Topology, measurements: Measurements | None, expect: Expectations,
          extra: list[Finding] | None = None, fabric: dict[str, Any] | None = None) -> Verdict:
    """The whole node. ``measurements`` is None when CUDA could not run (``extra`` says why);
    ``fabric`` is the host's PCIe fabric facts (module_utils/pci_fabric.py), when known."""
    findings: list[Finding] = list(extra or [])
    gpus_measured = {gm.nvml_index: gm for gm in (measurements.gpus if measurements else [])}
    pair_results = {(pm.src, pm.dst): pm for pm in (measurements.pairs if measurements else [])}
    for gpu in topology.gpus:
        findings.extend(_gpu_findings(gpu, gpus_measured.get(gpu.index)))
    measured_indices = set(gpus_measured)
    pairs_applicable = len(measured_indices) >= 2
    pair_verdicts: list[PairVerdict] = []
    if measurements is not None and pairs_applicable:
        for pair in topology.pairs:
            if pair.src in measured_indices and pair.dst in measured_indices:
                verdict, pair_findings = judge_pair(pair, topology, pair_results.get((pair.src, pair.dst)), expect,
                                                    gpus_measured)
                pair_verdicts.append(verdict)
                findings.extend(pair_findings)
    findings.extend(pcie_fabric.causes(fabric, topology, pair_verdicts, findings))
    missing_p2p = any("p2p-unavailable" in v.reasons for v in pair_verdicts)
    findings[:0] = _virtualization_findings(topology, missing_p2p)
    findings.extend(_count_findings(topology, measurements, expect, measured_indices))
    if measurements is not None and measurements.hung_step:
        findings.append(Finding("copy-hung", "fail", subject="node",
                                message=f"'{measurements.hung_step}' did not finish: the copy hung",
                                cause="P2P routed through a root complex that drops it (IOMMU/ACS), or a GPU fault",
                                fix=IOMMU_FIX, category="node"))
    _demote(findings, expect)
    code = exit_code_for(findings, pairs_applicable)
    for verdict in pair_verdicts:
        if verdict.status == "fail" and not any(f.severity == "fail" for f in findings
                                                if f.subject == pair_name(verdict.src, verdict.dst)):
            verdict.status = "warn"
    return Verdict(status=status_for(code), exit_code=code, summary=_summary(code, topology, measured_indices,
                                                                           pair_verdicts),
                   gpus_nvml=len(topology.gpus), gpus_measured=len(measured_indices),
                   pairs_applicable=pairs_applicable, pairs=pair_verdicts, findings=findings)


def _count_findings(topology: Topology, measurements: Measurements | None, expect: Expectations,
                    measured: set[int]) -> list[Finding]:
    findings = []
    if measurements is not None:
        unmeasured = [gpu.index for gpu in topology.gpus if gpu.index not in measured]
        if unmeasured:
            findings.append(Finding("gpus-not-measured", "warn", subject="node",
                                    message=f"NVML sees {len(topology.gpus)} GPU(s), CUDA measured {len(measured)}: "
                                    f"{', '.join(gpu_name(i) for i in unmeasured)} not measured",
                                    cause="CUDA_VISIBLE_DEVICES hides them, or their device nodes are missing here",
                                    category="node"))
    if measurements is not None and len(measured) < 2:
        findings.append(Finding("pairs-not-applicable", "info", subject="node",
                                message=f"{len(measured)} GPU measured: pair (P2P) checks are not applicable and this "
                                "result says nothing about P2P", category="info"))
    if expect.min_gpus is not None and len(measured) < expect.min_gpus:
        findings.append(Finding("too-few-gpus", "fail", subject="node",
                                message=f"{len(measured)} GPU(s) measured, {expect.min_gpus} required",
                                category="node"))
    return findings


def status_for(code: int) -> str:
    return {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_PAIRS_NOT_APPLICABLE: "pass (pairs not applicable)",
            EXIT_ENVIRONMENT: "environment"}.get(code, "fail")


def _summary(code: int, topology: Topology, measured: set[int], pairs: list[PairVerdict]) -> str:
    failing = sum(1 for p in pairs if p.status in ("fail", "not measured"))
    if code == EXIT_ENVIRONMENT:
        return "the GPUs could not be measured here (see findings)"
    if code == EXIT_PAIRS_NOT_APPLICABLE:
        return (f"{len(measured)} GPU measured: host links and device-local copy checked; "
                "pair (P2P) checks not applicable, nothing is said about P2P")
    if code == EXIT_FAIL:
        return f"{failing} of {len(pairs)} ordered pairs failing" if pairs else "node checks failed"
    return f"all {len(pairs)} ordered pairs of {len(measured)} GPUs met expectations"
