"""``gpunode p2p``: read the topology, measure every copy, judge, report. One call, one exit code.

Order: NVML topology (no CUDA needed), then cuInit through libcuda (its error code names the HMM
case), then PyTorch and the measurements in a worker thread watched by this one: a copy that hangs
(P2P through a root complex that drops it) becomes a finding and an exit code instead of a check
that never returns.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, TextIO

from gpunode.stages.p2p import measure, report, topology, verdict
from gpunode.stages.p2p.measure import MAX_SIZE_MB, Measurements, Target
from gpunode.stages.p2p.verdict import EXIT_BAD_INPUT, Expectations, Finding, environment_finding

DEFAULT_SIZE_MB = 512  # nvbandwidth's default buffer size: large enough to reach link speed


def input_problems(expect: Expectations, size_mb: int) -> list[str]:
    problems = expect.problems()
    if isinstance(size_mb, bool) or not isinstance(size_mb, int) or not 1 <= size_mb <= MAX_SIZE_MB:
        problems.append(f"size_mb must be an integer from 1 to {MAX_SIZE_MB}, got {size_mb!r}")
    return problems


def run(*, as_json: bool, expect: Expectations, size_mb: int, quick: bool, out: TextIO,
        fabric: dict[str, Any] | None = None) -> int:
    """Run the whole check on this machine, write the report to ``out``, return the exit code.
    ``fabric``: the host's PCIe fabric facts (module_utils/pci_fabric.py), for the verdict's causes."""
    problems = input_problems(expect, size_mb)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    measure.apply_safe_environment()
    check = _Check(expect, measure.method_for(size_mb, quick), fabric)
    result = check.execute()
    emit(result, as_json, out)
    if result.measurements is not None and result.measurements.hung_step:
        # A CUDA call is stuck in the worker thread; interpreter shutdown would wait on the driver.
        out.flush()
        sys.stderr.flush()
        os._exit(result.verdict.exit_code)
    return result.verdict.exit_code


def emit(result: report.P2PReport, as_json: bool, out: TextIO) -> None:
    if as_json:
        import json

        json.dump(report.to_json(result), out, indent=2)
        out.write("\n")
    else:
        report.render_text(result, out)
    out.flush()


class _Check:
    def __init__(self, expect: Expectations, method: measure.Method, fabric: dict[str, Any] | None = None) -> None:
        self.expect = expect
        self.fabric = fabric
        self.method = method
        self.began = time.perf_counter()
        self.timing: dict[str, float] = {}
        self.findings: list[Finding] = []
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.topology: topology.Topology | None = None
        self.probe: measure.DriverProbe | None = None
        self.measurements: Measurements | None = None

    def _phase(self, name: str, since: float) -> None:
        self.timing[name] = round(time.perf_counter() - since, 3)

    def execute(self) -> report.P2PReport:
        try:
            if self._read_topology():
                torch = self._start_cuda()
                if torch is not None:
                    self._measure(torch)
        finally:
            self._shutdown_nvml()
        self.timing["total_s"] = round(time.perf_counter() - self.began, 3)
        return self._result()

    def _result(self) -> report.P2PReport:
        if self.topology is None:
            code = verdict.exit_code_for(self.findings, pairs_applicable=False)
            node = verdict.Verdict(status=verdict.status_for(code), exit_code=code,
                                   summary="no GPU could be read here (see findings)", gpus_nvml=0, gpus_measured=0,
                                   pairs_applicable=False, pairs=[], findings=self.findings)
        else:
            node = verdict.judge(self.topology, self.measurements, self.expect, self.findings, self.fabric)
        return report.P2PReport(verdict=node, expectations=self.expect, topology=self.topology,
                                  measurements=self.measurements, method=self.method, cuda_driver=self.probe,
                                  timing=self.timing)

    # -- NVML ----------------------------------------------------------------------------------
    def _read_topology(self) -> bool:
        since = time.perf_counter()
        try:
            import pynvml  # the nvidia-ml-py distribution; never the deprecated 'pynvml' shim package
        except ImportError:
            self.findings.append(environment_finding("no-nvml", "the nvidia-ml-py package is not installed",
                                                     fix="pip install nvidia-ml-py"))
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.findings.append(environment_finding(
                "nvml-init", f"NVML did not start: {exc}",
                "no NVIDIA driver here: the kernel module is not loaded on the host, or libnvidia-ml is not in this "
                "container", "install the driver on the host and the same version's user-space in the container"))
            return False
        self.nvml = pynvml
        try:
            self.handles = topology.device_handles(pynvml)
            if not self.handles:
                self.findings.append(environment_finding("no-gpu", "NVML sees no GPU",
                                                         "no /dev/nvidiaN device nodes passed into this container",
                                                         "pass the GPUs in (Proxmox devN entries)"))
                return False
            self.topology = topology.read_topology(pynvml, self.handles)
        except pynvml.NVMLError as exc:  # a GPU that answers its index but not its name or UUID
            self.findings.append(environment_finding("nvml-read", f"NVML could not read the GPUs: {exc}",
                                                     "a GPU fell off the bus or the driver is wedged",
                                                     "check dmesg for Xid errors and nvidia-smi on the host"))
            return False
        self._phase("nvml_s", since)
        return True

    def _shutdown_nvml(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    # -- CUDA ----------------------------------------------------------------------------------
    def _start_cuda(self) -> Any:
        since = time.perf_counter()
        assert self.topology is not None
        self.probe = measure.probe_cuda_driver()
        driver_findings = verdict.driver_probe_findings(self.probe, self.topology.host)
        if driver_findings:
            self.findings.extend(driver_findings)
            return None
        try:
            torch = measure.import_torch()
        except ImportError as exc:
            self.findings.append(environment_finding(
                "no-torch", f"PyTorch is not importable here ({exc})",
                "the check measures through CUDA via PyTorch", "run it inside the server image, where torch is"))
            return None
        if not torch.cuda.is_available():
            self.findings.append(environment_finding(
                "cuda-unavailable", f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) cannot use CUDA",
                "a CPU-only torch build, or a driver older than this torch's CUDA runtime needs",
                "use the server image's torch; the host driver must be >= what its CUDA needs"))
            return None
        try:
            torch.cuda.init()
        except RuntimeError as exc:
            self.findings.append(environment_finding("cuda-unavailable", f"CUDA did not start in PyTorch: {exc}"))
            return None
        self._phase("cuda_init_s", since)
        return torch

    def _targets(self, torch: Any) -> list[Target]:
        assert self.topology is not None
        gpus = self.topology.gpus
        ordinals = measure.cuda_ordinals(torch, [(gpu.index, gpu.uuid, gpu.pci_bus_id) for gpu in gpus])
        return [Target(gpu.index, ordinals[gpu.index], gpu.cpu_affinity) for gpu in gpus if gpu.index in ordinals]

    def _measure(self, torch: Any) -> None:
        since = time.perf_counter()
        targets = self._targets(torch)
        results = Measurements(torch_version=str(torch.__version__), cuda_runtime=torch.version.cuda,
                               cuda_device_count=torch.cuda.device_count())
        self.measurements = results
        if not targets:
            self.findings.append(environment_finding(
                "no-cuda-match", "no CUDA device matches an NVML GPU by UUID or PCI bus id",
                "CUDA_VISIBLE_DEVICES hides every GPU, or CUDA and NVML see different devices"))
            return
        progress = measure.Progress()
        crashed: list[BaseException] = []

        def during_load(nvml_index: int) -> None:
            assert self.topology is not None
            self.topology.gpu(nvml_index).under_load = topology.read_under_load(self.nvml, self.handles[nvml_index])

        def work() -> None:
            try:
                measure.measure_node(torch, targets, self.method, progress, results, during_load)
            except BaseException as exc:  # reported as a finding; the watchdog thread decides
                crashed.append(exc)

        worker = threading.Thread(target=work, name="p2p-measure", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
            stuck = progress.overdue(self.method.step_timeout_s)
            if stuck is not None:
                results.hung_step = stuck
                break
        for exc in crashed:
            self.findings.append(Finding("measurement-crashed", "fail", subject="node",
                                         message=f"{type(exc).__name__}: {exc}", category="node"))
        self._phase("measure_s", since)
