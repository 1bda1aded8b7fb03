"""The p2p check as it ran on a real GPU (one H200, a Firecracker VM with GPU pass-through).

Everything here reads tests/fixtures/p2p, recorded by tests/fixtures/p2p/record.sh on the device
machine: the check's JSON and text, the plain timed copy loop it is held to, the pair code path
with one GPU as both ends, nvidia-smi's own view (-q and topo), and the log of exit codes and wall
times. No number here is made up, and no recording is edited: the exit codes recorded before
gpunode.ground.exitcodes gave each code one meaning (2026-12-01) are read through RECORDED_EXIT (the
single-GPU pass was 3 then, is 5 now). Tests marked ``recording`` are fixture-integrity checks:
they read the recordings and no gpunode code.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.ground import exitcodes
from gpunode.stages.p2p import report, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.recorded import RECORDED_EXIT  # noqa: E402 - tests/ put on the path just above

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "p2p"


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return _json("p2p.json")


@pytest.fixture
def result(recorded: dict[str, Any]) -> report.P2PReport:
    """The recorded result with its verdict's exit code read as today's."""
    as_recorded = report.result_from_json(recorded)
    now = dataclasses.replace(as_recorded.verdict, exit_code=RECORDED_EXIT[as_recorded.verdict.exit_code])
    return dataclasses.replace(as_recorded, verdict=now)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _json("reference.json")


def _smi_value(label: str) -> str:
    """The first 'label : value' of nvidia-smi -q."""
    match = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.+?)\s*$", (FIXTURES / "smi.txt").read_text(), re.MULTILINE)
    assert match, label
    return match.group(1)


def _smi_section_value(section: str, label: str) -> str:
    text = (FIXTURES / "smi.txt").read_text()
    start = text.index(section)
    match = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.+?)\s*$", text[start:], re.MULTILINE)
    assert match, (section, label)
    return match.group(1)


def test_json_round_trips_through_the_dataclasses(recorded: dict[str, Any]) -> None:
    assert report.to_json(report.result_from_json(recorded)) == recorded


def test_the_recorded_verdict_is_read_through_the_exit_code_map(recorded: dict[str, Any],
                                                                result: report.P2PReport) -> None:
    assert recorded["verdict"]["exit_code"] == 3 and result.verdict.exit_code == exitcodes.NOT_APPLICABLE


def test_judging_the_recorded_readings_again_gives_the_recorded_verdict(result: report.P2PReport) -> None:
    assert result.topology is not None
    again = verdict.judge(result.topology, result.measurements, result.expectations)
    assert again == result.verdict


def test_single_gpu_pass_through_vm_says_pairs_not_applicable_and_warns_about_p2p(result: report.P2PReport) -> None:
    node = result.verdict
    assert (node.exit_code, node.status) == (verdict.EXIT_PAIRS_NOT_APPLICABLE, "pass (pairs not applicable)")
    assert not node.pairs_applicable and node.pairs == []
    assert [f.code for f in node.findings] == ["vm-passthrough", "pairs-not-applicable"]
    vm = node.findings[0]
    assert vm.severity == "warn" and "P2P between them will be lost" in vm.message
    assert vm.cause and "flattened virtual PCIe tree" in vm.cause and "through host memory" in vm.cause
    assert "says nothing about P2P" in node.findings[1].message


def test_nvml_readings_agree_with_nvidia_smi(result: report.P2PReport) -> None:
    assert result.topology is not None
    (gpu,) = result.topology.gpus
    assert gpu.uuid == _smi_value("GPU UUID")
    assert gpu.pci_bus_id == _smi_value("Bus Id")
    assert _smi_value("Virtualization Mode") == "Pass-Through" and gpu.virtualization_mode == 1
    assert (gpu.pcie.max_gen, gpu.pcie.gpu_max_gen) == (int(_smi_section_value("PCIe Generation", "Max")),
                                                        int(_smi_section_value("PCIe Generation", "Device Max")))
    assert f"{gpu.pcie.max_width}x" == _smi_section_value("Link Width", "Max")
    assert f"{gpu.power_limit_w:.2f} W" == _smi_value("Current Power Limit")
    assert f"{gpu.max_clocks_mhz['sm']} MHz" == _smi_section_value("Max Clocks", "SM")
    assert f"{gpu.max_clocks_mhz['mem']} MHz" == _smi_section_value("Max Clocks", "Memory")
    assert result.topology.driver_version == _smi_value("Driver Version")


def test_topology_row_agrees_with_nvidia_smi_topo(result: report.P2PReport) -> None:
    assert result.topology is not None
    (gpu,) = result.topology.gpus
    row = next(line for line in (FIXTURES / "topo.txt").read_text().splitlines() if line.startswith("GPU0\t"))
    _, self_cell, cpus, numa_affinity, *rest = [cell.strip() for cell in row.split("\t")]
    assert self_cell == "X"
    assert report.cpu_ranges(gpu.cpu_affinity) == cpus == "0-15"
    assert report.cpu_ranges(gpu.numa_affinity) == numa_affinity == "0"
    assert rest[-1] == "N/A" and gpu.numa_node is None  # GPU NUMA ID: NVML says Not Supported in this VM
    assert gpu.unavailable["numa_node"] == "Not Supported"


@pytest.mark.recording
def test_link_was_read_while_copies_ran(result: report.P2PReport) -> None:
    assert result.topology is not None and result.measurements is not None
    (gpu,) = result.topology.gpus
    load = gpu.under_load
    assert load is not None and load.unavailable == {}
    assert (load.pcie_gen, load.pcie_width) == (gpu.pcie.max_gen, gpu.pcie.max_width) == (5, 16)
    # NVML's own PCIe counter saw the host-to-device traffic (it counts protocol overhead too).
    h2d = result.measurements.gpus[0].h2d
    assert h2d is not None and load.pcie_rx_mbps is not None and load.pcie_rx_mbps > 0.9 * h2d.median_gbps * 1000
    assert "gpu_idle" in gpu.idle_clock_event_reasons and "gpu_idle" not in load.clock_event_reasons
    assert load.sm_clock_mhz == gpu.max_clocks_mhz["sm"]


@pytest.mark.recording
@pytest.mark.parametrize("kind", ["h2d", "d2h", "d2d"])
def test_bandwidth_reaches_95_percent_of_the_plain_copy_loop(result: report.P2PReport, reference: dict[str, Any],
                                                              kind: str) -> None:
    assert result.measurements is not None
    measured = getattr(result.measurements.gpus[0], kind)
    assert measured.median_gbps >= 0.95 * reference[kind]["median_gbps"]


@pytest.mark.recording
def test_device_local_copy_counts_bytes_copied_once(result: report.P2PReport) -> None:
    # FIELD-NOTES s1: ~2126 GB/s of copied bytes on this H200 (read + write would be twice that).
    assert result.measurements is not None
    d2d = result.measurements.gpus[0].d2d
    assert d2d is not None and 0.95 * 2126 <= d2d.median_gbps <= 1.05 * 2126


@pytest.mark.recording
def test_every_measurement_is_verified_and_the_median_is_the_median(result: report.P2PReport) -> None:
    assert result.measurements is not None and result.method is not None
    gpu = result.measurements.gpus[0]
    for bandwidth in (gpu.h2d, gpu.d2h, gpu.d2d):
        assert bandwidth is not None and bandwidth.verified and bandwidth.mismatched_elements == 0
        assert bandwidth.median_gbps == statistics.median(bandwidth.samples_gbps)
        assert len(bandwidth.samples_gbps) == result.method.samples
    for latency in (gpu.h2d_latency, gpu.d2h_latency, gpu.d2d_latency):
        assert latency is not None and latency.verified and latency.median_us == statistics.median(latency.samples_us)
    assert gpu.errors == {} and gpu.pinning == "numa-local" and gpu.host_memory.startswith("cudaHostRegister")


@pytest.mark.recording
def test_one_gpu_check_runs_under_15_seconds(result: report.P2PReport) -> None:
    assert result.timing["total_s"] < 15
    walls = dict(re.findall(r"^(check_\w+) rc=\d+ wall_s=([\d.]+)$", (FIXTURES / "record-log.txt").read_text(),
                            re.MULTILINE))
    assert float(walls["check_json"]) < 15 and float(walls["check_text"]) < 15  # whole process, imports included


@pytest.mark.recording
def test_recorded_exit_codes() -> None:
    log = (FIXTURES / "record-log.txt").read_text()
    codes = {name: RECORDED_EXIT[int(rc)] for name, rc in re.findall(r"^(\w+) rc=(\d+)", log, re.MULTILINE)}
    assert codes == {"check_json": exitcodes.NOT_APPLICABLE, "check_text": exitcodes.NOT_APPLICABLE,
                     "check_min_gpus_8": exitcodes.FAILED, "reference": exitcodes.OK, "pair_path": exitcodes.OK}
    assert "min_gpus verdict: fail 1 ['vm-passthrough', 'pairs-not-applicable', 'too-few-gpus']" in log


@pytest.mark.recording
def test_recorded_text_report_shows_verdict_matrix_and_finding() -> None:
    text = (FIXTURES / "p2p.txt").read_text()
    recorded_code = {now: then for then, now in RECORDED_EXIT.items()}[exitcodes.NOT_APPLICABLE]
    assert text.startswith(f"gpunode p2p: PASS (PAIRS NOT APPLICABLE) (exit {recorded_code})")
    assert "WARN vm-passthrough GPU0" in text and "INFO pairs-not-applicable" in text
    assert re.search(r"GPU0 │\s+X\s+│ 0-15\s+│ 0\s+│ N/A", text)


def test_rendering_the_recorded_result(result: report.P2PReport) -> None:
    out = io.StringIO()
    report.render_text(result, out)
    text = out.getvalue()
    assert "exit 5:" in text and "pass-through" in text and "Gen5 x16" in text
    assert result.measurements is not None and result.measurements.gpus[0].h2d is not None
    assert f"{result.measurements.gpus[0].h2d.median_gbps:.1f}" in text


@pytest.mark.recording
def test_pair_code_path_ran_on_the_gpu_and_verified_its_copies() -> None:
    recorded = _json("pair_path.json")
    pair = recorded["pair"]
    assert "NOT P2P" in recorded["what"] and pair["errors"] == {}
    assert all(pair[kind]["verified"] for kind in ("uni", "bidir", "latency"))
    bidir = pair["bidir"]
    # both directions ran at once: together they moved what the total says
    assert bidir["forward_gbps"] + bidir["reverse_gbps"] == pytest.approx(bidir["median_gbps"], rel=0.02)


def test_projection_for_eight_gpus_is_under_90_seconds() -> None:
    spec = importlib.util.spec_from_file_location("p2p_time", ROOT / "benchmarks" / "p2p_time.py")
    assert spec and spec.loader
    p2p_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(p2p_time)
    projection = p2p_time.project(_json("p2p.json"), _json("pair_path.json"), gpus=8, same_numa_gpus=4)
    assert projection["ordered_pairs"] == {"same_numa": 24, "cross_numa": 32}
    assert "PROJECTION" in projection["what"]
    assert all(total < 90 for total in projection["projected_total_s"].values()), projection["projected_total_s"]
