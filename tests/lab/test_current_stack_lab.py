"""The current stack in the lab, end to end: the lab host file with image.stack sglang-0.5.23-cu130
provisions (the stand-in takes 0.5.23's flags and the current profile's launch), checks, smokes and
benches; `gpunode bench --ab stacks` puts both stacks side by side; the lab goes back to the seeds'."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

import gpunode_lab as lab

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
CURRENT = "sglang-0.5.23-cu130"


def _ssh(*remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def current_hosts(tmp_path_factory: pytest.TempPathFactory, gpunode_module) -> Iterator[Path]:
    data = yaml.safe_load(LAB_HOSTS.read_text())
    data["hosts"][0]["image"]["stack"] = CURRENT
    path = tmp_path_factory.mktemp("current") / "host.yml"
    path.write_text(yaml.safe_dump(data))
    first = gpunode_module("provision", str(path), "--json", timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    yield path
    # Back to the seeds' stack for the tests after this module.
    back = gpunode_module("provision", str(LAB_HOSTS), "--tags", "serve", "--json", timeout=900)
    assert back.returncode == 0, back.stderr[-3000:]


def test_the_current_profile_serves_in_the_lab(gpunode, current_hosts: Path) -> None:
    inspected = json.loads(_ssh("docker", "inspect", "gpunode-sglang").stdout)[0]
    argv = inspected["Args"]
    assert "--dsa-decode-backend=flashinfer_sparse_mla" in argv
    assert "--kv-cache-dtype=fp8_e4m3" in argv and "--disable-cuda-graph" not in argv
    env = dict(item.split("=", 1) for item in inspected["Config"]["Env"])
    assert env["FAKE_SGLANG_VERSION"] == "0.5.23" and env["SGLANG_DG_CACHE_DIR"] == "/var/cache/gpunode/deep_gemm"
    info = json.loads(_ssh("curl", "-sf", "http://127.0.0.1:30000/get_server_info").stdout)
    assert info["version"] == "0.5.23"

    check = gpunode("check", str(current_hosts), timeout=600)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    again = gpunode("provision", str(current_hosts), "--json", timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sum(json.loads(again.stdout)["stats"].get("changed", {}).values()) == 0


def test_bench_puts_the_two_stacks_side_by_side(gpunode, current_hosts: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = gpunode("bench", str(current_hosts), "--levels", "1", "--input-len", "32", "--output-len", "8",
                     "--ab", "stacks", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(raw) for raw in (out / "results.jsonl").read_text().splitlines()]
    assert [(line["gpunode"]["variant"], line["gpunode"]["ok"]) for line in lines] == [
        ("sglang-0.5.9-cu128", True), (CURRENT, True)]
    report = (out / "report.md").read_text()
    assert "## Levels with `image.stack sglang-0.5.9-cu128`" in report and f"`image.stack {CURRENT}`" in report
    # Restored to the host file's own stack: the current profile's launch again.
    argv = json.loads(_ssh("docker", "inspect", "gpunode-sglang").stdout)[0]["Args"]
    assert [a for a in argv if a.startswith("--dsa-decode-backend=")]
