"""`gpunode bench` on the lab host file, as a new user runs it: the bench runs on the node's engine
(where the model folder and the server are), two levels, an A/B pair, every file of the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"


@pytest.fixture(scope="module")
def converged(gpunode_module) -> None:
    result = gpunode_module("provision", str(LAB_HOSTS), timeout=900)
    assert result.returncode == 0, result.stderr


def test_bench_with_an_ab_pair_on_the_lab(gpunode, converged: None, tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = gpunode("bench", str(LAB_HOSTS), "--levels", "1,2", "--input-len", "32", "--output-len", "8",
                     "--ab", "attention", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restarting the server with --attention-backend triton" in result.stdout

    lines = [json.loads(raw) for raw in (out / "results.jsonl").read_text().splitlines()]
    assert [(line["gpunode"]["variant"], line["gpunode"]["concurrency"]) for line in lines] == [
        ("flashinfer", 1), ("flashinfer", 2), ("triton", 1), ("triton", 2)]
    for line in lines:
        ours = line["gpunode"]
        assert ours["ok"] and ours["range_ratio"] == 1.0 and line["completed"] == ours["num_prompts"]
        # The stand-in produced exactly what was asked: N prompts x 32 in, x 8 out.
        assert (line["total_input_tokens"], line["total_output_tokens"]) == (ours["num_prompts"] * 32,
                                                                              ours["num_prompts"] * 8)
        assert not ours["gpu"]["available"] and "not sampled" in ours["gpu"]["reason"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ab"]["flag"] == "--attention-backend" and summary["settings"]["range_ratio"] == 1.0
    report = (out / "report.md").read_text()
    assert "exactly 32 tokens in and 8 out per request" in report
    assert "## Levels with `--attention-backend flashinfer`" in report and "`--attention-backend triton`" in report
    for png in ("throughput.png", "power.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png})" in report
    assert "after the A/B the server was restarted with the host file's flags" in report

    # The server is back on the host file's flags: a second provision changes nothing.
    again = gpunode("provision", str(LAB_HOSTS), "--tags", "serve", "--json", timeout=600)
    assert again.returncode == 0, again.stderr
    assert sum(json.loads(again.stdout)["stats"].get("changed", {}).values()) == 0


def test_diagnose_reads_the_nodes_server_log(gpunode, converged: None) -> None:
    """A healthy server's log on the node: nothing to name (the stand-in logs what sglang logs)."""
    result = gpunode("diagnose", "--hosts", str(LAB_HOSTS), "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"findings": []}
