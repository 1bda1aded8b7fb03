"""The p2p check on two GPUs for real (device tool kind nvidia-h200-x2: two H200s joined by 18
NVLinks, a Firecracker VM with GPU pass-through). Everything here reads tests/fixtures/p2p/h200x2,
recorded in one command: the check's JSON and text, a plain timed peer copy loop for the same
pairs (tests/fixtures/p2p/reference_peer.py), and nvidia-smi topo. No number here is made up.
Tests marked ``recording`` are fixture-integrity checks: they read the recordings and no gpunode code.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.p2p import report, verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "p2p" / "h200x2"


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "p2p_x2.json").read_text())
    return data


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "reference_peer_x2.json").read_text())
    return data


def pair(recorded: dict[str, Any], src: int, dst: int) -> dict[str, Any]:
    return next(p for p in recorded["measurements"]["pairs"] if (p["src"], p["dst"]) == (src, dst))


@pytest.mark.recording
def test_two_gpus_pass_with_every_copy_verified(recorded: dict[str, Any]) -> None:
    assert recorded["verdict"]["status"] == "pass" and recorded["verdict"]["exit_code"] == 0
    assert recorded["verdict"]["pairs_applicable"] is True
    for p in recorded["measurements"]["pairs"]:
        assert p["uni"]["verified"] and p["uni"]["mismatched_elements"] == 0
        assert p["bidir"]["verified"] and p["bidir"]["mismatched_elements"] == 0
    assert recorded["timing"]["total_s"] < 15  # two GPUs, two ordered pairs


@pytest.mark.recording
@pytest.mark.parametrize("src,dst", [(0, 1), (1, 0)])
def test_pairs_reach_95_percent_of_the_plain_peer_loop(recorded: dict[str, Any], reference: dict[str, Any],
                                                      src: int, dst: int) -> None:
    ours = pair(recorded, src, dst)["uni"]["median_gbps"]
    plain = next(p for p in reference["pairs"] if (p["src"], p["dst"]) == (src, dst))
    assert plain["verified"] and plain["can_access_peer"]
    assert ours >= 0.95 * plain["uni_median_gbps"], (ours, plain["uni_median_gbps"])


@pytest.mark.recording
def test_bidirectional_is_two_links_worth(recorded: dict[str, Any], reference: dict[str, Any]) -> None:
    ours = pair(recorded, 0, 1)["bidir"]["median_gbps"]
    plain = next(p for p in reference["pairs"] if (p["src"], p["dst"]) == (0, 1))["bidir_median_gbps"]
    assert ours >= 0.95 * plain
    # Both directions at once over NVLink: close to twice one direction.
    assert ours > 1.8 * pair(recorded, 0, 1)["uni"]["median_gbps"]


@pytest.mark.recording
def test_topology_matches_nvidia_smi(recorded: dict[str, Any]) -> None:
    text = (FIXTURES / "topo_x2.txt").read_text()
    rows = {m.group(1): m.group(2).split() for m in re.finditer(r"^(GPU\d)\s+(.*)$", text, re.M)}
    smi = {(int(r[3]), col): cells[col] for r, cells in rows.items() for col in range(2)}
    for p in recorded["topology"]["pairs"]:
        assert smi[(p["src"], p["dst"])] == p["legend"], p
    assert all(p["legend"] == "NV18" and p["nvlinks"] == 18 for p in recorded["topology"]["pairs"])


def test_nvlink_pairs_are_judged_against_the_nvlink_expectation(recorded: dict[str, Any]) -> None:
    result = report.result_from_json(recorded)
    assert result.topology is not None
    classes = {verdict.classify(p, result.topology.gpus[p.src], result.topology.gpus[p.dst])
               for p in result.topology.pairs}
    assert classes == {"nvlink"}
    # The same readings against a bar they do not reach: each pair fails, exit 1, with a cause.
    strict = dataclasses.replace(result.expectations, nvlink_gbps=500.0)
    again = verdict.judge(result.topology, result.measurements, strict)
    assert again.exit_code == 1
    assert all(p.status == "fail" for p in again.pairs)
    # And as recorded, judged again: the same pass.
    assert verdict.judge(result.topology, result.measurements, result.expectations).exit_code == 0
