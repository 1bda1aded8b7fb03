"""What the p2p verdict says, as types: its findings (``gpunode.ground.finding.Finding``, shipped into
the image beside this package), a pair's verdict, and the names of their subjects. Apart from
verdict.py so that the fabric's causes (fabric.py) can be said in the same words."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.ground.finding import Finding as Finding  # the verdict's findings; tests take it from here

# A finding in the JSON report (its verdict's findings, which the p2p stage's record and `gpunode
# check` read back from the node). Its severity is fail | warn | info; its subject node, GPU0 or
# GPU0->GPU1 (NVML indices); its category environment | data | p2p (demoted to warn when not
# required) | node | info.
KEYS = {"severity": "severity", "code": "code", "subject": "subject", "message": "message", "cause": "cause",
        "fix": "fix", "category": "category"}


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
