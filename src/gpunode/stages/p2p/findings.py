"""What the p2p verdict says, as types: a finding, a pair's verdict, and the names of their subjects.
Apart from verdict.py so that the fabric's causes (fabric.py) can be said in the same words."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Finding:
    severity: str  # fail | warn | info
    code: str  # stable identifier for automation
    subject: str  # node, GPU0, GPU0->GPU1 (NVML indices)
    message: str
    cause: str | None = None
    fix: str | None = None
    category: str = "node"  # environment | data | p2p (demoted to warn when not required) | node | info


@dataclass
class PairVerdict:
    src: int
    dst: int
    link_class: str  # nvlink | same_numa | cross_numa
    legend: str
    expected_gbps: float
    measured_gbps: float | None
    bidir_gbps: float | None
    latency_us: float | None
    path: str | None
    status: str  # pass | fail | warn (a failure with required: false) | not measured
    reasons: list[str] = field(default_factory=list)  # finding codes


def gpu_name(index: int) -> str:
    return f"GPU{index}"


def pair_name(src: int, dst: int) -> str:
    return f"GPU{src}->GPU{dst}"
