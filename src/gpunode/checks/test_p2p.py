"""Layer p2p: the verdict of the last P2P measurement, recorded on the node by the p2p stage."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.checks.conftest import node_record

FIX = "run `gpunode provision --tags p2p`"


def test_p2p_verdict(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    record = node_record(gpu_node, "p2p")
    if record is None:
        if gpunode_host["lab"]:
            pytest.skip("lab: no GPU behind the node, so P2P is never measured here (README, 'The lab')")
        pytest.fail(f"no P2P verdict recorded on the node (/etc/gpunode/p2p.json) -> {FIX}")
    gpus = gpunode_host["container"]["gpus"]
    assert record["gpus"] == gpus, f"measured with GPUs {record['gpus']}, the host file selects {gpus} -> {FIX}"
    failed = "; ".join(record["failed"]) or record["summary"]
    # The fabric causes the verdict named (acs, bar1, p2p_mode, write_collapse), each with its own fix, in
    # the failure; a warning one (p2p_mode, write_collapse: the measurements cannot show them) passes, as
    # warnings do in layer host.
    causes = "; ".join(record.get("causes") or [])
    assert record["ok"], (f"P2P {record['status']} (exit {record['exit_code']}): {failed}"
                          f"{'; causes: ' + causes if causes else ''} -> {FIX}")
