"""`gpunode check`: run the testinfra node checks and report pass/fail per check, by layer.

Exit codes: 0 every check passed (pending ones say what waits for a reload or reboot), 1 a
check failed, 2 bad input.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpunode import inventory
from gpunode.checks import CHECKS_DIR, LAYERS
from gpunode.hostfile import HostFile
from gpunode.paths import state_dir

NOT_IN_LAYER = "not-in-layer"


@dataclass
class CheckResult:
    layer: str
    host: str
    check: str
    status: str  # pass, fail, pending, skip
    message: str = ""


@dataclass
class CheckReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(r.status == "fail" for r in self.results) else 0

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "pending": 0, "skip": 0}
        for result in self.results:
            out[result.status] += 1
        return out


def _message(report: Any) -> str:
    if report.outcome == "skipped" or getattr(report, "wasxfail", None):
        text = getattr(report, "wasxfail", "") or (report.longrepr[2] if isinstance(report.longrepr, tuple) else "")
        return str(text).removeprefix("Skipped: ").removeprefix("reason: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    # "AssertionError: <our message>\nassert ..." -> our message, on one line
    ours = text.split("\nassert ")[0].removeprefix("AssertionError: ").removeprefix("Failed: ")
    return " ".join(ours.split())


class _Collector:
    """A pytest plugin that keeps one CheckResult per test and host."""

    def __init__(self) -> None:
        self.report = CheckReport()
        self.items: dict[str, tuple[str, str]] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            params = dict(getattr(getattr(item, "callspec", None), "params", {}))
            host = str(params.pop("_testinfra_host", "")).split("://")[-1].rstrip(">")
            extra = ",".join(str(v) for v in params.values())
            self.items[item.nodeid] = (host, item.originalname + (f"[{extra}]" if extra else ""))

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and not (report.outcome in ("skipped", "failed") and report.when == "setup"):
            return
        layer = Path(report.nodeid.split("::")[0]).stem.removeprefix("test_")
        host, check = self.items.get(report.nodeid, ("", report.nodeid))
        if getattr(report, "wasxfail", None):
            status = "pending"
        elif report.outcome == "skipped":
            status = "skip"
        else:
            status = "pass" if report.outcome == "passed" else "fail"
        message = _message(report) if status != "pass" else ""
        if status == "skip" and message.startswith(NOT_IN_LAYER):
            return
        self.report.results.append(CheckResult(layer, host, check, status, message))


def run_checks(hostfile: HostFile, secrets: inventory.SecretFiles, layers: list[str] | None = None,
               source: Path | None = None) -> CheckReport:
    import pytest

    folder = state_dir() / "check"
    folder.mkdir(parents=True, exist_ok=True)
    inv = folder / "inventory.json"
    inv.write_text(json.dumps(inventory.build(hostfile, secrets, source), indent=2))
    chosen = layers or list(LAYERS)
    files = [str(CHECKS_DIR / f"test_{layer}.py") for layer in chosen if (CHECKS_DIR / f"test_{layer}.py").exists()]
    collector = _Collector()
    # testinfra's ansible backend calls ansible-inventory: the one beside this interpreter.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    args = [*files, "--hosts=ansible://all", f"--ansible-inventory={inv}", "-p", "no:cacheprovider",
            "-c", os.devnull, "--rootdir", str(CHECKS_DIR), "-q", "--no-header", "-rN", "-p", "no:randomly"]
    with open(os.devnull, "w") as sink:
        saved = sys.stdout
        sys.stdout = sink  # pytest's own report is ours to render
        try:
            pytest.main(args, plugins=[collector])
        finally:
            sys.stdout = saved
    return collector.report


def render(report: CheckReport, console: Console) -> None:
    marks = {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]", "pending": "[yellow]PEND[/yellow]",
             "skip": "[dim]SKIP[/dim]"}
    for layer in LAYERS:
        rows = [r for r in report.results if r.layer == layer]
        if not rows:
            continue
        console.print(f"[bold]{layer}[/bold]")
        for r in rows:
            line = f"  {marks[r.status]} {escape(r.host)}  {escape(r.check)}"
            if r.message:
                line += f": {escape(r.message)}"
            console.print(line, soft_wrap=True, highlight=False)
    c = report.counts()
    console.print(f"{c['pass']} passed, {c['fail']} failed, {c['pending']} pending, {c['skip']} skipped",
                  highlight=False)


def as_json(report: CheckReport) -> str:
    return json.dumps({"exit_code": report.exit_code, "counts": report.counts(),
                       "results": [asdict(r) for r in report.results]}, indent=2)
