"""`gpunode diagnose`: a server log in, the named failure and its fix out; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OOM_LOG = ROOT / "tests" / "fixtures" / "serve" / "oom.log"


def test_known_failure_is_named(gpunode) -> None:
    result = gpunode("diagnose", str(OOM_LOG))
    assert result.returncode == 0
    first, line, cause, fix = result.stdout.splitlines()
    assert first == "cuda_oom: CUDA out of memory" and fix.startswith("  fix:   lower --mem-fraction-static")
    assert line.startswith("  line:  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 400.00 GiB")
    assert cause.startswith("  cause: ")


def test_a_quiet_log_has_no_findings(gpunode, tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "gpunode", "diagnose", "-", "--json"], input="all quiet\n",
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"findings": []}


def test_no_log_and_no_host_file_is_bad_input(gpunode) -> None:
    result = gpunode("diagnose")
    assert result.returncode == 2 and "give a log file" in result.stderr


def test_missing_log_is_bad_input(gpunode, tmp_path: Path) -> None:
    result = gpunode("diagnose", str(tmp_path / "nope.log"))
    assert result.returncode == 2 and result.stderr.strip() == f"error: {tmp_path / 'nope.log'}: No such file or directory"
