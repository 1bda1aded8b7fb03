"""Samples -> one level's GPU summary and its single most telling finding.

Per GPU: mean and peak power (and as a share of the enforced power limit, called TDP in the
findings), mean utilisation, SM clock against its maximum, peak memory used, the hottest reading,
how often each clock-event reason was active, and mean PCIe TX/RX. For the node: the mean of the
GPUs' mean power shares, the highest peak share, the mean utilisation, and one finding.

The finding is the first of these that holds (thresholds below, named):

1. ``unavailable``/``no-samples``: nothing to judge;
2. ``thermal``: a thermal slowdown reason in >= REASON_SHARE of a GPU's samples;
3. ``hw-slowdown``: hardware slowdown or power brake (external signal, PSU, cooling), same share;
4. ``power-capped``: the software power cap in >= POWER_CAP_SHARE of a GPU's samples. Higher than
   REASON_SHARE because NVML's power reading (and the cap) lags about a second: on the H200
   recording, 17 % of the samples of a copy phase right after a capped GEMM phase still carried it;
5. ``idle``: mean utilisation < IDLE_UTIL_PCT: the GPUs wait, so the server is not the bottleneck;
6. ``imbalanced``: one GPU's utilisation differs from the others' by > IMBALANCE_PCT points;
7. ``pcie-bound``: busy at < LOW_POWER_SHARE of the limit while PCIe carries >= PCIE_HEAVY_MBPS
   (TX + RX, mean of the busiest GPU): transfers, not GEMMs, keep the GPU "busy" (NVML counts a
   running copy as busy: 100 % during host-to-device copies at 34 % of TDP on the H200);
8. ``busy-low-power``: utilisation >= BUSY_UTIL_PCT at < LOW_POWER_SHARE of the limit: kernels are
   always running but the tensor cores are not saturated (small GEMMs, launch- or
   communication-bound), what the seeds saw: 100 % busy at ~250-330 W of 600 W (FIELD-NOTES s5),
   and what a CUDA graph of 256x256 products gives on the H200: 97 % busy at 26 % of TDP;
9. ``saturated``: busy and drawing >= LOW_POWER_SHARE of the limit;
10. ``partly-busy``: anything else.

NVML's utilisation is the share of time in which at least one kernel ran, not how much of the GPU
it used: that is why power against the limit is the second half of every finding.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from gpunode.bench.sampler import SampleSet
from gpunode.stages.p2p.topology import reason_names

REASON_SHARE = 0.10  # a thermal or HW slowdown reason active in at least this share of samples counts
POWER_CAP_SHARE = 0.25
PCIE_HEAVY_MBPS = 10_000.0  # 10 GB/s: a sixth of a Gen5 x16 link's 63 GB/s per direction
IDLE_UTIL_PCT = 20.0
BUSY_UTIL_PCT = 80.0
LOW_POWER_SHARE = 0.60
IMBALANCE_PCT = 30.0
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
HW_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")


@dataclass
class GpuSummary:
    index: int
    name: str
    samples: int
    power_limit_w: float | None = None
    mean_power_w: float | None = None
    peak_power_w: float | None = None
    mean_power_share: float | None = None
    peak_power_share: float | None = None
    mean_util_pct: float | None = None
    mean_mem_util_pct: float | None = None
    mean_sm_clock_mhz: float | None = None
    max_sm_clock_mhz: int | None = None  # the GPU's maximum, for comparison
    peak_mem_used_mib: float | None = None
    max_temp_c: int | None = None
    reasons: dict[str, float] = field(default_factory=dict)  # reason -> share of samples it was active
    pcie_tx_mbps: float | None = None  # mean over the PCIe readings
    pcie_rx_mbps: float | None = None
    pcie_peak_mbps: float | None = None


@dataclass
class GpuLevelSummary:
    available: bool
    reason: str = ""
    interval_s: float | None = None
    window_s: float | None = None
    ticks: int = 0
    gpus: list[GpuSummary] = field(default_factory=list)
    mean_power_share: float | None = None
    peak_power_share: float | None = None
    mean_util_pct: float | None = None
    node_mean_power_w: float | None = None
    finding_kind: str = "unavailable"
    finding: str = ""
    unsupported: list[str] = field(default_factory=list)  # readings NVML refused, e.g. "power_instant"
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuLevelSummary:
        plain = {k: v for k, v in data.items() if k != "gpus"}
        return cls(**plain, gpus=[GpuSummary(**g) for g in data.get("gpus", [])])


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def _share(value: float | None, limit: float | None) -> float | None:
    return None if value is None or not limit else value / limit


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def summarise_gpu(data: SampleSet, index: int) -> GpuSummary:
    info = next((g for g in data.gpus if g.index == index), None)
    rows = [s for s in data.samples if s.gpu == index]
    power = [float(s.power_w) for s in rows if s.power_w is not None]
    # The peak: the instantaneous reading where the driver gives one (the averaged one hides spikes).
    peaks = [float(p) for p in (s.power_instant_w if s.power_instant_w is not None else s.power_w for s in rows)
             if p is not None]
    limit = info.power_limit_w if info else None
    mean_power, peak_power = _mean(power), _max(peaks)
    with_reasons = [s for s in rows if s.reasons is not None]
    counts: dict[str, int] = {}
    for sample in with_reasons:
        for name in reason_names(sample.reasons):
            counts[name] = counts.get(name, 0) + 1
    pcie = [p for p in data.pcie if p.gpu == index]
    tx = [p.tx_mbps for p in pcie if p.tx_mbps is not None]
    rx = [p.rx_mbps for p in pcie if p.rx_mbps is not None]
    return GpuSummary(
        index=index, name=info.name if info else "?", samples=len(rows), power_limit_w=limit,
        mean_power_w=_round(mean_power), peak_power_w=_round(peak_power),
        mean_power_share=_round(_share(mean_power, limit), 3), peak_power_share=_round(_share(peak_power, limit), 3),
        mean_util_pct=_round(_mean([float(s.util_gpu) for s in rows if s.util_gpu is not None])),
        mean_mem_util_pct=_round(_mean([float(s.util_mem) for s in rows if s.util_mem is not None])),
        mean_sm_clock_mhz=_round(_mean([float(s.sm_clock_mhz) for s in rows if s.sm_clock_mhz is not None]), 0),
        max_sm_clock_mhz=info.max_sm_clock_mhz if info else None,
        peak_mem_used_mib=_max([s.mem_used_mib for s in rows if s.mem_used_mib is not None]),
        max_temp_c=max((s.temp_c for s in rows if s.temp_c is not None), default=None),
        reasons={name: round(count / len(with_reasons), 3) for name, count in sorted(counts.items())},
        pcie_tx_mbps=_round(_mean(tx)), pcie_rx_mbps=_round(_mean(rx)),
        pcie_peak_mbps=_round(_max([max(a, b) for a, b in zip(tx, rx, strict=False)] or tx or rx)),
    )


def summarise(data: SampleSet) -> GpuLevelSummary:
    """The level's summary and finding from its samples (all GPUs the sampler saw)."""
    unsupported = sorted({key.split(".", 1)[-1] for key in data.unsupported})
    if not data.available:
        return GpuLevelSummary(available=False, reason=data.reason, finding_kind="unavailable",
                               finding=f"GPU sampling unavailable: {data.reason}", errors=list(data.errors))
    gpus = [summarise_gpu(data, info.index) for info in data.gpus]
    ticks = len({s.t for s in data.samples})
    result = GpuLevelSummary(available=True, interval_s=data.interval_s, window_s=round(data.duration_s, 2),
                             ticks=ticks, gpus=gpus, unsupported=unsupported, errors=list(data.errors))
    shares = [g.mean_power_share for g in gpus if g.mean_power_share is not None]
    peaks = [g.peak_power_share for g in gpus if g.peak_power_share is not None]
    utils = [g.mean_util_pct for g in gpus if g.mean_util_pct is not None]
    powers = [g.mean_power_w for g in gpus if g.mean_power_w is not None]
    result.mean_power_share = _round(_mean(shares), 3)
    result.peak_power_share = _round(_max(peaks), 3)
    result.mean_util_pct = _round(_mean(utils))
    result.node_mean_power_w = _round(sum(powers)) if powers else None
    result.finding_kind, result.finding = judge(result)
    return result


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{share * 100:.0f} %"


def _reason_share(gpu: GpuSummary, names: tuple[str, ...]) -> float:
    return max((gpu.reasons.get(name, 0.0) for name in names), default=0.0)


def judge(level: GpuLevelSummary) -> tuple[str, str]:
    """(kind, sentence): the single most telling finding, in the order of the module docstring."""
    gpus = [g for g in level.gpus if g.samples]
    if not gpus:
        return "no-samples", "no GPU sample was taken in this level's window"
    worst = max(gpus, key=lambda g: _reason_share(g, THERMAL_REASONS))
    if _reason_share(worst, THERMAL_REASONS) >= REASON_SHARE:
        return "thermal", (f"thermal throttling: GPU {worst.index} slowed by heat in "
                           f"{_pct(_reason_share(worst, THERMAL_REASONS))} of samples (up to {worst.max_temp_c} °C); "
                           "check airflow and fan curves before tuning the server")
    worst = max(gpus, key=lambda g: _reason_share(g, HW_REASONS))
    if _reason_share(worst, HW_REASONS) >= REASON_SHARE:
        return "hw-slowdown", (f"hardware slowdown on GPU {worst.index} in {_pct(_reason_share(worst, HW_REASONS))} "
                               "of samples (power brake or HW slowdown): check the power supply and cooling")
    worst = max(gpus, key=lambda g: g.reasons.get("sw_power_cap", 0.0))
    capped = worst.reasons.get("sw_power_cap", 0.0)
    if capped >= POWER_CAP_SHARE:
        clock = (f", SM clock {worst.mean_sm_clock_mhz:.0f} of {worst.max_sm_clock_mhz} MHz"
                 if worst.mean_sm_clock_mhz is not None and worst.max_sm_clock_mhz else "")
        limit = f"{worst.power_limit_w:.0f} W " if worst.power_limit_w else ""
        return "power-capped", (f"power-capped: GPU {worst.index} held to its {limit}limit in {_pct(capped)} of samples "
                                f"(peak {_pct(worst.peak_power_share)}, mean {_pct(worst.mean_power_share)} of TDP"
                                f"{clock}): the GPUs are the bottleneck at this power limit")
    util = level.mean_util_pct
    share = level.mean_power_share
    if util is None:
        return "partly-busy", f"utilisation not readable here; mean power {_pct(share)} of TDP"
    if util < IDLE_UTIL_PCT:
        return "idle", (f"idle GPUs ({util:.0f} % busy at {_pct(share)} of TDP): the server is not the bottleneck; "
                        "the client, the request rate or the scheduler is")
    utils = [g.mean_util_pct for g in gpus if g.mean_util_pct is not None]
    if len(utils) > 1 and max(utils) - min(utils) > IMBALANCE_PCT:
        low = min(gpus, key=lambda g: g.mean_util_pct if g.mean_util_pct is not None else 100.0)
        others = [g.mean_util_pct for g in gpus if g is not low and g.mean_util_pct is not None]
        return "imbalanced", (f"imbalanced: GPU {low.index} is {low.mean_util_pct:.0f} % busy while the others average "
                              f"{statistics.fmean(others):.0f} %: tensor-parallel ranks should be equally busy")
    pcie = max(gpus, key=lambda g: (g.pcie_tx_mbps or 0.0) + (g.pcie_rx_mbps or 0.0))
    pcie_mbps = (pcie.pcie_tx_mbps or 0.0) + (pcie.pcie_rx_mbps or 0.0)
    if util >= BUSY_UTIL_PCT and share is not None and share < LOW_POWER_SHARE and pcie_mbps >= PCIE_HEAVY_MBPS:
        return "pcie-bound", (f"{util:.0f} % busy at {_pct(share)} of TDP with {pcie_mbps / 1000:.1f} GB/s over PCIe "
                              f"(GPU {pcie.index}): transfers, not GEMMs, keep the GPUs busy")
    if util >= BUSY_UTIL_PCT and share is not None and share < LOW_POWER_SHARE:
        return "busy-low-power", (f"{util:.0f} % busy at {_pct(share)} of TDP: small GEMMs, not saturated tensor cores "
                                  "(launch-, latency- or communication-bound kernels)")
    if util >= BUSY_UTIL_PCT and share is not None:
        return "saturated", (f"{util:.0f} % busy at {_pct(share)} of TDP: the GPUs do full work; more throughput "
                             "needs more GPU, not more concurrency")
    return "partly-busy", f"{util:.0f} % busy at {_pct(share)} of TDP: the GPUs wait part of the time"
