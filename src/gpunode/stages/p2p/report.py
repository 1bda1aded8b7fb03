"""The check's output: a readable report (rich tables and matrices) and JSON with every number.

``to_json`` / ``result_from_json`` round-trip a ``P2PReport`` through plain JSON, so recorded
runs (tests/fixtures/p2p) can be judged and rendered again without a GPU.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, TextIO, Union, get_args, get_origin, get_type_hints

from gpunode.stages.p2p.measure import Bandwidth, DriverProbe, GpuMeasurements, Latency, Measurements, Method
from gpunode.stages.p2p.topology import LEGEND_TEXT, Gpu, Topology, link_gbps
from gpunode.stages.p2p.findings import KEYS as FINDING_KEYS
from gpunode.stages.p2p.verdict import EXIT_CODES, Expectations, Finding, PairVerdict, Verdict, gpu_name

SCHEMA = "gpunode.p2p/1"  # the record format's name, kept when the package moved
P2P_SHORT: dict[str, str] = {
    "OK": "OK", "CHIPSET_NOT_SUPPORTED": "CNS", "GPU_NOT_SUPPORTED": "GNS", "IOH_TOPOLOGY_NOT_SUPPORTED": "TNS",
    "DISABLED_BY_REGKEY": "DR", "NOT_SUPPORTED": "NS", "UNKNOWN": "U",
}
SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "cyan"}
STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "not measured": "red"}


@dataclass
class P2PReport:
    """The whole check: the verdict, what it was judged against, the readings, how they were taken."""

    verdict: Verdict
    expectations: Expectations
    topology: Topology | None = None
    measurements: Measurements | None = None
    method: Method | None = None
    cuda_driver: DriverProbe | None = None
    timing: dict[str, float] = field(default_factory=dict)
    schema: str = SCHEMA


# -- JSON --------------------------------------------------------------------------------------

def to_json(result: P2PReport) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    data["verdict"]["findings"] = [finding.as_dict(FINDING_KEYS) for finding in result.verdict.findings]
    ordered = {"schema": data.pop("schema"), "verdict": data.pop("verdict")}
    ordered.update(data)
    return ordered


def _from_plain(kind: Any, value: Any) -> Any:
    """Rebuild a value of type ``kind`` (dataclass, list, dict, optional, scalar) from plain JSON."""
    if value is None:
        return None
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(kind) if arg is not type(None)]
        return _from_plain(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        return kind(**{name: _from_plain(hints[name], item) for name, item in value.items() if name in known})
    if origin is list:
        (item_kind,) = get_args(kind)
        return [_from_plain(item_kind, item) for item in value]
    if origin is dict:
        _, item_kind = get_args(kind)
        return {key: _from_plain(item_kind, item) for key, item in value.items()}
    if kind is float and isinstance(value, int):
        return float(value)
    return value


def result_from_json(data: dict[str, Any]) -> P2PReport:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema: {data.get('schema')!r})")
    result: P2PReport = _from_plain(P2PReport, data)
    return result


# -- text --------------------------------------------------------------------------------------

def cpu_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8', as nvidia-smi prints CPU affinity."""
    if not cpus:
        return "N/A"
    ranges: list[str] = []
    start = previous = cpus[0]
    for cpu in cpus[1:] + [None]:  # type: ignore[list-item]
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        ranges.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(ranges)


def _num(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _link(gen: int | None, width: int | None) -> str:
    return "-" if gen is None or width is None else f"Gen{gen} x{width}"


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def render_text(result: P2PReport, out: TextIO) -> None:
    from rich.console import Console  # only the text report needs rich

    console = Console(file=out, highlight=False, width=None if out.isatty() else 180, soft_wrap=False,
                      markup=True)
    verdict = result.verdict
    style = {0: "bold green", 3: "bold yellow"}.get(verdict.exit_code, "bold red")
    console.print(f"[{style}]gpunode p2p: {verdict.status.upper()}[/] (exit {verdict.exit_code}): "
                  f"{escape(verdict.summary)}")
    topology = result.topology
    if topology is not None:
        _print_host(console, result)
        _print_topology_matrix(console, topology)
        if len(topology.gpus) > 1:
            _print_p2p_status(console, topology)
        _print_gpus(console, topology)
    if result.measurements is not None and topology is not None:
        _print_host_copies(console, topology, result.measurements)
        if verdict.pairs:
            _print_pair_matrices(console, topology, verdict.pairs)
            _print_pairs(console, verdict.pairs)
    _print_findings(console, verdict.findings)
    expect = result.expectations
    console.print(f"expectations (unidirectional, GB/s): same NUMA {expect.same_numa_gbps:g}, cross NUMA "
                  f"{expect.cross_numa_gbps:g}, NVLink {expect.nvlink_gbps:g}; required: {expect.required}"
                  + (f"; min GPUs: {expect.min_gpus}" if expect.min_gpus else ""))
    total = result.timing.get("total_s")
    console.print(f"exit {verdict.exit_code}: {EXIT_CODES.get(verdict.exit_code, '')}"
                  + (f"; checked in {total:.1f} s" if total is not None else ""))


def _print_host(console: Any, result: P2PReport) -> None:
    topology = result.topology
    assert topology is not None
    host = topology.host
    measured = result.measurements
    runtime = f", torch {measured.torch_version} (CUDA {measured.cuda_runtime})" if measured else ""
    where = "VM (CPU hypervisor flag)" if host.hypervisor_cpu_flag else "no hypervisor flag"
    if host.container:
        where += f", container: {host.container}"
    console.print(escape(f"driver {topology.driver_version}, CUDA driver {topology.cuda_driver_version}{runtime}; "
                  f"kernel {host.kernel}; {where}; uvm_disable_hmm={host.uvm_disable_hmm}; IOMMU groups: "
                  f"{host.iommu_groups}; cmdline: {' '.join(host.iommu_cmdline) or '-'}"))


def _print_topology_matrix(console: Any, topology: Topology) -> None:
    from rich.table import Table

    console.print("Topology (nvidia-smi topo -m legend)")
    table = Table()
    table.add_column("")
    for gpu in topology.gpus:
        table.add_column(gpu_name(gpu.index), justify="center")
    table.add_column("CPU Affinity")
    table.add_column("NUMA Affinity")
    table.add_column("GPU NUMA ID")
    for src in topology.gpus:
        cells = []
        for dst in topology.gpus:
            pair = topology.pair(src.index, dst.index)
            cells.append("X" if src.index == dst.index else pair.legend if pair else "?")
        numa_id = "N/A" if src.numa_node is None else str(src.numa_node)
        table.add_row(gpu_name(src.index), *cells, cpu_ranges(src.cpu_affinity), cpu_ranges(src.numa_affinity),
                      numa_id)
    console.print(table)
    used = {pair.legend if not pair.legend.startswith("NV") else "NV#" for pair in topology.pairs} | {"X"}
    for key, text in LEGEND_TEXT.items():
        if key in used or key in ("X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#"):
            console.print(f"  {key:<4} = {text}")


def _print_p2p_status(console: Any, topology: Topology) -> None:
    from rich.table import Table

    console.print("NVML P2P status per ordered pair: read/write nvlink/atomics (row: source)")
    table = Table()
    table.add_column("")
    for gpu in topology.gpus:
        table.add_column(gpu_name(gpu.index), justify="center")
    for src in topology.gpus:
        cells = []
        for dst in topology.gpus:
            pair = topology.pair(src.index, dst.index)
            if pair is None:
                cells.append("X")
                continue
            short = {cap: P2P_SHORT.get(pair.p2p_reason.get(cap, "?"), "?") for cap in ("read", "write", "nvlink",
                                                                                      "atomics")}
            cells.append(f"{short['read']}/{short['write']} {short['nvlink']}/{short['atomics']}")
        table.add_row(gpu_name(src.index), *cells)
    console.print(table)
    console.print("  OK = supported, CNS = chipset not supported, GNS = GPU not supported, TNS = topology (IOH) not "
                  "supported, DR = disabled by regkey, NS = not supported, U = unknown, ? = NVML refused")


def _print_gpus(console: Any, topology: Topology) -> None:
    from rich.table import Table

    console.print("GPUs (NVML)")
    table = Table()
    for name in ("GPU", "name", "bus id", "NUMA", "virtualization", "PCIe idle", "PCIe under load", "PCIe max",
                 "power limit", "SM/mem MHz under load", "clock events under load", "NVLinks"):
        table.add_column(name)
    for gpu in topology.gpus:
        load = gpu.under_load
        table.add_row(
            gpu_name(gpu.index), gpu.name, gpu.pci_bus_id, _numa_text(gpu),
            gpu.virtualization or "-", _link(gpu.pcie.idle_gen, gpu.pcie.idle_width),
            _link(load.pcie_gen, load.pcie_width) if load else "not read",
            _link(gpu.pcie.max_gen, gpu.pcie.max_width), _num(gpu.power_limit_w, 0, " W"),
            f"{load.sm_clock_mhz}/{load.mem_clock_mhz}" if load else "-",
            ", ".join(load.clock_event_reasons) or "none" if load else "-", str(gpu.nvlinks_active))
    console.print(table)


def _numa_text(gpu: Gpu) -> str:
    if gpu.numa_node is not None:
        return str(gpu.numa_node)
    if gpu.numa_affinity:
        return f"{cpu_ranges(gpu.numa_affinity)} (affinity)"
    return "N/A"


def _bw(result: Bandwidth | None) -> str:
    if result is None:
        return "-"
    mark = "" if result.verified else " DATA WRONG"
    return f"{result.median_gbps:.1f}{mark}"


def _lat(result: Latency | None) -> str:
    return "-" if result is None else f"{result.median_us:.2f}"


def _print_host_copies(console: Any, topology: Topology, measured: Measurements) -> None:
    from rich.table import Table

    console.print("Host links and device-local copy (median GB/s of bytes copied; copy latency us)")
    table = Table()
    for name in ("GPU", "CUDA", "H2D", "D2H", "D2D", "% of link", "lat H2D", "lat D2H", "lat D2D", "verified",
                 "measuring thread CPUs"):
        table.add_column(name)
    for gm in measured.gpus:
        gpu = topology.gpu(gm.nvml_index)
        table.add_row(gpu_name(gm.nvml_index), str(gm.cuda_ordinal), _bw(gm.h2d), _bw(gm.d2h), _bw(gm.d2d),
                      _link_share(gpu, gm), _lat(gm.h2d_latency), _lat(gm.d2h_latency), _lat(gm.d2d_latency),
                      _verified(gm), f"{cpu_ranges(gm.pinned_cpus)} ({gm.pinning})")
    console.print(table)


def _link_share(gpu: Gpu, gm: GpuMeasurements) -> str:
    load = gpu.under_load
    limit = link_gbps(load.pcie_gen, load.pcie_width) if load else None
    best = max((r.median_gbps for r in (gm.h2d, gm.d2h) if r is not None), default=None)
    if limit is None or best is None:
        return "-"
    return f"{100 * best / limit:.0f}% of {limit:.0f}"


def _verified(gm: GpuMeasurements) -> str:
    results = [r for r in (gm.h2d, gm.d2h, gm.d2d, gm.h2d_latency, gm.d2h_latency, gm.d2d_latency) if r is not None]
    if not results:
        return "-"
    return "yes" if all(r.verified for r in results) else "NO"


def _print_pair_matrices(console: Any, topology: Topology, pairs: list[PairVerdict]) -> None:
    from rich.table import Table

    by_pair = {(p.src, p.dst): p for p in pairs}
    indices = sorted({p.src for p in pairs} | {p.dst for p in pairs})
    for title, value, digits in (("P2P unidirectional GB/s (row: source, column: destination)", "measured_gbps", 1),
                                 ("P2P bidirectional GB/s, both directions together", "bidir_gbps", 1),
                                 ("P2P copy latency us", "latency_us", 2)):
        console.print(title)
        table = Table()
        table.add_column("")
        for index in indices:
            table.add_column(gpu_name(index), justify="right")
        for src in indices:
            cells = []
            for dst in indices:
                pair = by_pair.get((src, dst))
                if pair is None:
                    cells.append("X" if src == dst else "-")
                    continue
                text = _num(getattr(pair, value), digits)
                style = STATUS_STYLE.get(pair.status, "") if value == "measured_gbps" else ""
                cells.append(f"[{style}]{text}[/]" if style else text)
            table.add_row(gpu_name(src), *cells)
        console.print(table)


def _print_pairs(console: Any, pairs: list[PairVerdict]) -> None:
    from rich.table import Table

    console.print("Pairs")
    table = Table()
    for name in ("pair", "class", "path", "expected", "unidir", "bidir", "latency us", "status", "reasons"):
        table.add_column(name)
    for pair in pairs:
        style = STATUS_STYLE.get(pair.status, "")
        table.add_row(f"{gpu_name(pair.src)}->{gpu_name(pair.dst)}", f"{pair.link_class} ({pair.legend})",
                      pair.path or "-", f"{pair.expected_gbps:g}", _num(pair.measured_gbps), _num(pair.bidir_gbps),
                      _num(pair.latency_us, 2), f"[{style}]{pair.status}[/]", ", ".join(pair.reasons) or "-")
    console.print(table)


def _print_findings(console: Any, findings: list[Finding]) -> None:
    if not findings:
        console.print("findings: none")
        return
    console.print("findings:")
    for finding in findings:
        style = SEVERITY_STYLE.get(finding.severity, "")
        console.print(f"  [{style}]{finding.severity.upper()}[/] {finding.code} {finding.subject}: "
                      f"{escape(finding.message)}")
        if finding.cause:
            console.print(f"      likely cause: {escape(finding.cause)}")
        if finding.fix:
            console.print(f"      fix: {escape(finding.fix)}")
