"""One redaction (gpunode.ground.redact) behind every output of a run: the progress lines and the log,
each failure (hence the recap and summary.json), ansible-runner's artifacts and gpunode check's
messages hide the run's own secret values and the shapes of secrets (a server log's api_key=...)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpunode.checks import run as check

from gpunode import hostfile, inventory, runner
from gpunode.checks.run import CheckReport
from gpunode.ground.result import CheckResult

ROOT = Path(__file__).resolve().parents[2]
KEY = "-the-runs-own-key-51c"


def test_progress_lines_the_log_and_failures_hide_the_runs_secrets() -> None:
    screen, log = io.StringIO(), io.StringIO()
    progress = runner.Progress(Console(file=screen, width=300), log, known=(KEY,))
    progress({"event": "runner_on_failed", "event_data": {"host": "pve-lab-ct200", "task": "serve", "res": {
        "failed": True, "msg": f"serve: server exited; log: ServerArgs(api_key='{KEY}') --admin-api-key adm1n"}}})
    (failure,) = progress.failures
    for text in (screen.getvalue(), log.getvalue(), failure.message):
        assert KEY not in text and "adm1n" not in text and "***" in text


def test_artifacts_are_scrubbed_of_the_runs_secret_values(tmp_path: Path) -> None:
    events = tmp_path / "job_events"
    events.mkdir()
    (events / "1-x.json").write_text(f'{{"stdout": "token {KEY} here"}}')
    (tmp_path / "stdout").write_text("nothing secret\n")
    runner.scrub_artifacts(tmp_path, (KEY,))
    assert (events / "1-x.json").read_text() == '{"stdout": "token *** here"}'
    assert (tmp_path / "stdout").read_text() == "nothing secret\n"


def test_secret_values_are_read_from_the_runs_files(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    assert inventory.secret_values({("pve-lab", "api_key"): key, ("pve-lab", "password"): tmp_path / "gone"}) == (KEY,)


def test_check_messages_hide_the_runs_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "key"
    key.write_text(KEY)
    said = CheckReport(results=[CheckResult("test_server_container_running", "fail",
                                            f"exited; last log lines: server_args=ServerArgs(api_key='{KEY}')",
                                            layer="serve", host="pve-lab-ct200")],
                       error=f"Bearer {KEY}")
    monkeypatch.setattr(check, "_run_checks", lambda *_args: said)
    hf = hostfile.load(ROOT / "inventory" / "lab" / "host.yml")
    report = check.run_checks(hf, {("pve-lab", "api_key"): key})
    assert KEY not in report.results[0].message and "api_key='***'" in report.results[0].message
    assert report.error == "Bearer ***"
