"""Per-level GPU summaries and findings, from the H200 recording (tests/fixtures/bench) and, for
the cases a single idle-or-loaded GPU cannot show (heat, several GPUs), from sets built here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from gpunode.bench.sampler import GpuInfo, PcieSample, Sample, SampleSet
from gpunode.bench.summary import GpuLevelSummary, summarise

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "h200_sampler_load.json"


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def phase(recording: dict[str, Any], name: str) -> SampleSet:
    whole = SampleSet.from_json(recording["sample_set"])
    bounds = next(p for p in recording["phases"] if p["name"] == name)
    return whole.window(bounds["t0"], bounds["t1"])


@pytest.mark.recording
def test_the_recording_is_what_the_readme_says(recording: dict[str, Any]) -> None:
    whole = SampleSet.from_json(recording["sample_set"])
    assert whole.available and whole.interval_s == 0.1 and whole.unsupported == {} and whole.errors == []
    assert [g.name for g in whole.gpus] == ["NVIDIA H200"] and whole.gpus[0].power_limit_w == 700.0
    assert len(whole.samples) == 281 and len(whole.pcie) == 280
    ticks = [s.t for s in whole.samples]
    gaps = [b - a for a, b in itertools.pairwise(ticks[1:])]  # the first tick came after the static reads
    assert 0.099 < min(gaps) and max(gaps) < 0.102  # not wall-clock: the fixed grid held on the real GPU
    assert 20 < whole.call_ms["pcie_throughput"] < 25  # NVML's 20 ms counting window per call


def test_idle(recording: dict[str, Any]) -> None:
    level = summarise(phase(recording, "idle"))
    gpu = level.gpus[0]
    assert level.finding_kind == "idle"
    assert gpu.mean_util_pct is not None and gpu.mean_util_pct < 1
    assert gpu.mean_power_w is not None and 110 < gpu.mean_power_w < 125  # ~117 W of 700
    assert level.mean_power_share == pytest.approx(0.168, abs=0.005)
    assert gpu.mean_sm_clock_mhz == 1980 and gpu.reasons == {}
    assert level.finding.startswith("idle GPUs (0 % busy at 17 % of TDP): the server is not the bottleneck")


def test_small_gemms_are_busy_at_low_power(recording: dict[str, Any]) -> None:
    """The seeds' signature, reproduced: kernels always running, tensor cores mostly idle."""
    level = summarise(phase(recording, "small_gemm_graph"))
    assert level.finding_kind == "busy-low-power"
    assert level.mean_util_pct is not None and level.mean_util_pct >= 95
    assert level.mean_power_share is not None and 0.24 < level.mean_power_share < 0.28  # ~181 W
    assert level.finding == ("97 % busy at 26 % of TDP: small GEMMs, not saturated tensor cores "
                             "(launch-, latency- or communication-bound kernels)")


def test_large_gemms_hit_the_power_cap(recording: dict[str, Any]) -> None:
    level = summarise(phase(recording, "large_gemm"))
    gpu = level.gpus[0]
    assert level.finding_kind == "power-capped"
    assert gpu.reasons["sw_power_cap"] > 0.95
    assert gpu.mean_power_w is not None and 650 < gpu.mean_power_w < 700
    # The instantaneous field catches the spikes the 1 s average hides: 883 W at the step.
    assert gpu.peak_power_w == pytest.approx(883.2, abs=0.1) and level.peak_power_share == pytest.approx(1.262)
    assert gpu.mean_sm_clock_mhz is not None and gpu.mean_sm_clock_mhz < 1600 and gpu.max_sm_clock_mhz == 1980
    assert gpu.mean_mem_util_pct is not None and gpu.mean_mem_util_pct > 20
    assert "held to its 700 W limit in 99 % of samples" in level.finding


def test_copies_are_busy_and_pcie_bound(recording: dict[str, Any]) -> None:
    level = summarise(phase(recording, "h2d_copy"))
    gpu = level.gpus[0]
    assert level.finding_kind == "pcie-bound"
    # NVML's RX counter reads ~59 GB/s while torch timed 54.9 GB/s of payload.
    assert gpu.pcie_rx_mbps is not None and gpu.pcie_rx_mbps > 50_000
    assert gpu.pcie_tx_mbps is not None and gpu.pcie_tx_mbps < gpu.pcie_rx_mbps / 5
    # The cap carried over from the GEMM phase (NVML's power lags ~1 s) stays under POWER_CAP_SHARE.
    assert 0.1 < gpu.reasons["sw_power_cap"] < 0.25
    assert level.finding.startswith("100 % busy at 34 % of TDP with 64.2 GB/s over PCIe")


def test_whole_recording_and_json(recording: dict[str, Any]) -> None:
    level = summarise(SampleSet.from_json(recording["sample_set"]))
    assert level.finding_kind == "power-capped" and level.ticks == 281
    assert GpuLevelSummary.from_json(json.loads(json.dumps(level.to_json()))) == level


# -- built sets: what one GPU under a plain load cannot show --------------------------------------

def built(gpus: int, rows: list[dict[str, Any]], limit: float | None = 600.0, pcie_mbps: float = 0.0) -> SampleSet:
    """``rows`` repeated for 20 ticks; each row a Sample's fields for every GPU unless it names one."""
    samples = []
    for tick in range(20):
        for gpu in range(gpus):
            fields = next((r for r in rows if r.get("gpu") == gpu), rows[0])
            samples.append(Sample(t=tick * 0.1, **{**fields, "gpu": gpu}))
    return SampleSet(available=True, interval_s=0.1, duration_s=2.0,
                     gpus=[GpuInfo(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", f"GPU-{i}", power_limit_w=limit,
                                   max_sm_clock_mhz=2430) for i in range(gpus)],
                     samples=samples,
                     pcie=[PcieSample(t=0.0, gpu=g, tx_mbps=pcie_mbps / 2, rx_mbps=pcie_mbps / 2) for g in range(gpus)])


BUSY = {"power_w": 300.0, "util_gpu": 100, "sm_clock_mhz": 2400, "temp_c": 60, "reasons": 0}


def test_thermal_wins_over_everything() -> None:
    hot = {**BUSY, "gpu": 3, "temp_c": 91, "reasons": 0x20 | 0x4}
    level = summarise(built(8, [BUSY, hot]))
    assert level.finding_kind == "thermal"
    assert level.finding.startswith("thermal throttling: GPU 3 slowed by heat in 100 % of samples (up to 91 °C)")


def test_hardware_slowdown() -> None:
    level = summarise(built(2, [{**BUSY, "reasons": 0x80}]))
    assert level.finding_kind == "hw-slowdown" and "power brake" in level.finding


def test_seeds_node_busy_at_low_power_on_eight_gpus() -> None:
    """FIELD-NOTES s5: 100 % utilisation at ~250-330 W of 600 W on 8 RTX PRO 6000."""
    level = summarise(built(8, [{**BUSY, "power_w": 266.0}]))
    assert level.finding_kind == "busy-low-power" and level.finding.startswith("100 % busy at 44 % of TDP")
    assert level.node_mean_power_w == pytest.approx(8 * 266.0)


def test_imbalanced_ranks() -> None:
    level = summarise(built(4, [BUSY, {**BUSY, "gpu": 2, "util_gpu": 40}]))
    assert level.finding_kind == "imbalanced"
    assert level.finding.startswith("imbalanced: GPU 2 is 40 % busy while the others average 100 %")


def test_saturated_partly_busy_and_pcie() -> None:
    assert summarise(built(2, [{**BUSY, "power_w": 480.0}])).finding_kind == "saturated"
    assert summarise(built(2, [{**BUSY, "util_gpu": 50}])).finding_kind == "partly-busy"
    assert summarise(built(2, [BUSY], pcie_mbps=30_000)).finding_kind == "pcie-bound"


def test_unreadable_numbers_are_none_not_a_crash() -> None:
    blank = {"power_w": None, "util_gpu": None, "reasons": None}
    level = summarise(built(1, [blank], limit=None))
    assert level.gpus[0].mean_power_share is None and level.mean_util_pct is None
    assert level.finding_kind == "partly-busy" and "utilisation not readable" in level.finding
    busy_no_limit = summarise(built(1, [BUSY], limit=None))
    assert busy_no_limit.mean_power_share is None and busy_no_limit.finding_kind == "partly-busy"


def test_unavailable_and_empty() -> None:
    level = summarise(SampleSet(available=False, reason="NVML did not start: Driver Not Loaded"))
    assert level.finding_kind == "unavailable"
    assert level.finding == "GPU sampling unavailable: NVML did not start: Driver Not Loaded"
    empty = summarise(SampleSet(available=True, gpus=[GpuInfo(0, "x", "GPU-0")]))
    assert empty.finding_kind == "no-samples"
