"""`gpunode smoke --url` through the real CLI against the local SGLang-like server."""

from __future__ import annotations

import json
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above


def test_cli_smoke_passes_and_names_a_wrong_answer(gpunode, tmp_path: Path) -> None:
    with fake_server(tmp_path, api_key="k-123") as (_process, url):
        ok = gpunode("smoke", "--local", "--url", url, "--api-key-env", "T_KEY", "--json", env={"T_KEY": "k-123"})
        unauthorised = gpunode("smoke", "--local", "--url", url, "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] and {c["name"] for c in report["checks"] if c["status"] == "pass"} >= {"health", "answer", "tool_call"}
    assert "k-123" not in ok.stdout + ok.stderr
    assert unauthorised.returncode == 1
    missing = gpunode("smoke", "--local", "--url", url, "--api-key-env", "T_UNSET")
    assert missing.returncode == 2 and "T_UNSET is not set" in missing.stderr
