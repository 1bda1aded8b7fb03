"""gpunode check's report: grouped by layer in build order, counts, --json, exit codes; bad input
is refused with a line per problem and exit 2 before any host is contacted."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from gpunode.check import CheckReport, CheckResult, as_json, render
from gpunode.checks import LAYERS

LAB = Path(__file__).resolve().parents[2] / "inventory" / "lab" / "host.yml"


def report() -> CheckReport:
    return CheckReport([
        CheckResult("server", "node", "test_server_healthy", "fail", "/health_generate answered 503 -> run x"),
        CheckResult("host", "pve", "test_hmm_option_configured", "pass"),
        CheckResult("p2p", "node", "test_p2p_verdict", "skip", "lab: no GPU"),
        CheckResult("host", "pve", "test_host_finding[hmm]", "pending", "reload nvidia_uvm"),
    ])


def test_text_is_grouped_by_layer_in_build_order() -> None:
    out = io.StringIO()
    render(report(), Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line in LAYERS] == ["host", "p2p", "server"]
    assert lines[1] == "  PASS pve  test_hmm_option_configured"
    assert lines[2] == "  PEND pve  test_host_finding[hmm]: reload nvidia_uvm"
    assert "  FAIL node  test_server_healthy: /health_generate answered 503 -> run x" in lines
    assert lines[-1] == "1 passed, 1 failed, 1 pending, 1 skipped"


def test_json_and_exit_code() -> None:
    data = json.loads(as_json(report()))
    assert data["exit_code"] == 1 and data["counts"] == {"pass": 1, "fail": 1, "pending": 1, "skip": 1}
    assert data["results"][0] == {"layer": "server", "host": "node", "check": "test_server_healthy",
                                  "status": "fail", "message": "/health_generate answered 503 -> run x"}
    passing = CheckReport([r for r in report().results if r.status != "fail"])
    assert passing.exit_code == 0, "pending and skipped checks do not fail the node"


def test_unknown_layer_is_bad_input(gpunode) -> None:
    result = gpunode("check", str(LAB), "--layer", "gpu")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: unknown layer 'gpu' (layers: host, container, inside, image, p2p, "
                                     "server)")


def test_malformed_host_file_is_bad_input(gpunode, tmp_path: Path) -> None:
    bad = tmp_path / "host.yml"
    bad.write_text("version: 2\nhosts: []\n")
    result = gpunode("check", str(bad), "--json")
    assert result.returncode == 2 and result.stdout == ""
    # one line per problem, each naming the file, the key and the line
    assert result.stderr.splitlines() == [f"error: {bad}: version: must be 1 (line 1)",
                                          f"error: {bad}: hosts: needs at least 1 item(s) (line 2)"]
    assert not (tmp_path / "state").exists(), "nothing written for bad input"
