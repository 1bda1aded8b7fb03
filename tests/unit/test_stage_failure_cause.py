"""A failed stage's message (the task's msg, hence the recap's line and summary.json's failure) is
the failure itself, not the first note the stage printed on its way (CI once read "lab: memlock
capped ..." where the server's launch had been refused)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpunode import derive, hostfile, runner
from gpunode.stages.engine import Forward
from gpunode.stages.serve import command as serve_command
from gpunode.stages.serve import stage as serve_stage
from gpunode.stages.serve.diagnose import Diagnosis
from gpunode.stages.common import StageResult, Target

ROOT = Path(__file__).resolve().parents[2]
NOTE = "lab: memlock capped at 8 MiB (this machine has no CAP_SYS_RESOURCE); a real node gives unlimited"


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> Target:
    import json

    from gpunode.stages import engine

    host = hostfile.load(ROOT / "inventory" / "lab" / "host.yml").hosts[0]
    derived = derive.derive(host)
    # The model stage's record of verified weights: the serve stage starts only on those.
    plan = derived.model
    verified = json.dumps({"ok": True, "repo": plan.repo, "revision": plan.revision, "weights_dir": plan.weights_dir})
    monkeypatch.setattr(engine, "read_file", lambda _ssh, _path, timeout_s=20.0: verified)
    monkeypatch.setattr(engine, "link_count", lambda _ssh, _path, timeout_s=20.0: 2)  # the store's mount is live
    return Target(host, derived)


def test_the_serve_stages_failure_is_the_servers_diagnosis_not_its_first_note(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    diagnosis = Diagnosis("bad_flag", "sglang refused its arguments", "fix server.flags in the host file",
                          "launch_server: error: argument --api-key: expected one argument", 2)
    monkeypatch.setattr(serve_stage, "node_settings", lambda _target, _url: ({}, [NOTE]))
    monkeypatch.setattr(serve_command, "run_serve",
                        lambda *_a, **_k: serve_command.ServeOutcome(1, diagnosis=diagnosis))
    result = serve_stage.run(target, Forward("unix:///nonexistent.sock", {target.host.server.port: 40000}), check_mode=False)
    assert result.failed and result.summary[0] == NOTE  # the note stays in the progress lines
    assert result.failure() == ("sglang refused its arguments (log: launch_server: error: argument --api-key: "
                                "expected one argument) -> fix server.flags in the host file")


def test_a_refused_start_is_its_own_message(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_stage, "node_settings", lambda _target, _url: ({}, [NOTE]))
    monkeypatch.setattr(serve_command, "run_serve", lambda *_a, **_k: serve_command.ServeOutcome(
        1, messages=["Docker refused the server container: port is already allocated"]))
    result = serve_stage.run(target, Forward("unix:///nonexistent.sock", {target.host.server.port: 40000}), check_mode=False)
    assert result.failure() == "Docker refused the server container: port is already allocated"


def test_a_result_without_a_cause_says_its_first_line() -> None:
    assert StageResult(failed=True, summary=["p2p: fail (exit 5): P2P is disabled"]).failure() == \
        "p2p: fail (exit 5): P2P is disabled"
    assert StageResult(failed=True).failure() == "failed"


def test_the_recap_and_summary_carry_the_modules_message() -> None:
    """The module fails with ``f"{stage}: {result.failure()}"``; the runner keeps that as the failure."""
    result = StageResult(failed=True, summary=[NOTE, "server: error"], cause="sglang refused its arguments")
    msg = f"serve: {result.failure()}"
    progress = runner.Progress(Console(file=io.StringIO(), width=200), io.StringIO())
    event: dict[str, Any] = {"event": "runner_on_failed", "event_data": {
        "host": "pve-lab-ct200", "task": "serve : Run the serve stage", "res": {"msg": msg, "failed": True,
                                                                            "gpunode_summary": "\n".join(result.summary)}}}
    progress(event)
    (failure,) = progress.failures
    assert failure.message == "serve: sglang refused its arguments"
    assert NOTE not in failure.message

