"""`gpunode check`: run the testinfra node checks and report pass/fail per check, by layer.

Exit codes: 0 every check passed (pending ones say what waits for a reload or reboot), 1 a
check failed, 2 bad input, 3 a host was unreachable (its checks did not run; nothing else
failed), 4 no check could run (pytest or testinfra missing or refusing its arguments, nothing
collected), 130 interrupted. A run that checked nothing is never green.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpunode.ground import exitcodes

from gpunode import inventory
from gpunode.checks import CHECKS_DIR, LAYERS, UNREACHABLE, result_field, tail
from gpunode.derive import ROUTER_NODE, node_name
from gpunode.hostfile import HostFile
from gpunode.ground.paths import ANSIBLE_CFG, control_path_dir, state_dir
from gpunode.ground.redact import redact
from gpunode.ground.result import CheckResult

NOT_IN_LAYER = "not-in-layer"


def result_as_dict(result: CheckResult) -> dict[str, str]:
    """One check as `gpunode check --json` gives it (and a group's report file keeps it)."""
    return {"layer": result.layer, "host": result.host, "check": result.name, "status": result.status,
            "message": result.message}


def result_from_dict(data: dict[str, str]) -> CheckResult:
    return CheckResult(data["check"], data["status"], data["message"], layer=data["layer"], host=data["host"])


# pytest's exit codes that are not a test outcome (pytest.ExitCode), and what gpunode says of them.
NOT_AN_OUTCOME = {2: "interrupted", 3: "pytest's internal error", 4: "pytest refused its arguments",
                  5: "no check was collected"}
EXIT_FAILED, EXIT_UNREACHABLE, EXIT_NOT_RUN, EXIT_INTERRUPTED = (exitcodes.FAILED, exitcodes.UNREACHABLE,
                                                          exitcodes.ENVIRONMENT, exitcodes.INTERRUPTED)


@dataclass
class CheckReport:
    results: list[CheckResult] = field(default_factory=list)
    error: str = ""  # set when no check could run: one line saying why
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.error or not self.results:
            return EXIT_NOT_RUN
        if any(r.status == "fail" for r in self.results):
            return EXIT_FAILED
        if any(r.status == "unreachable" for r in self.results):
            return EXIT_UNREACHABLE
        return 0

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "pending": 0, "skip": 0, "unreachable": 0}
        for result in self.results:
            out[result.status] += 1
        return out

    def unreachable(self) -> dict[str, tuple[str, int]]:
        """Host -> (the connection's error, how many checks did not run)."""
        out: dict[str, tuple[str, int]] = {}
        for r in self.results:
            if r.status == "unreachable":
                out[r.host] = (r.message, out.get(r.host, ("", 0))[1] + 1)
        return out


def _message(report: Any) -> str:
    if report.outcome == "skipped" or getattr(report, "wasxfail", None):
        text = getattr(report, "wasxfail", "") or (report.longrepr[2] if isinstance(report.longrepr, tuple) else "")
        return str(text).removeprefix("Skipped: ").removeprefix("reason: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    # "AssertionError: <our message>\nassert ..." -> our message, on one line (pytest's own
    # explanation after it may show a CommandResult: ours is what counts)
    ours = text.split("\nassert ")[0].removeprefix("AssertionError: ").removeprefix("Failed: ")
    if "CommandResult(" in ours:  # no message of ours: an exception that carries testinfra's repr
        return command_failure(ours)
    return " ".join(ours.split())


def command_failure(text: str, width: int = 300) -> str:
    """testinfra's CommandResult repr (which may carry a whole script) as the command's first line,
    its exit status and the last lines of its stderr."""
    command = result_field(text, "command").strip()
    status = re.search(r"exit_status=(-?\d+)", text)
    stderr = tail(result_field(text, "_stderr"))
    first = command.splitlines()[0] if command else "?"
    shown = first if len(first) <= 80 and "\n" not in command else first[:77] + "..."
    return (f"command `{shown}` failed (exit {status.group(1) if status else '?'}): "
            f"{stderr or 'no error output'}")[:width]


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
        if status == "skip" and message.startswith(f"{UNREACHABLE}: "):
            status, message = "unreachable", message.removeprefix(f"{UNREACHABLE}: ")
        self.report.results.append(CheckResult(check, status, message, layer=layer, host=host))


def check_groups(hostfile: HostFile, layers: list[str]) -> list[tuple[str, list[str]]]:
    """What runs side by side: each host of the file with its GPU node, and the router machine
    (inventory names); each group's checks run in a pytest of their own."""
    groups: list[tuple[str, list[str]]] = []
    if any(layer != "router" for layer in layers):
        groups += [(host.name, [host.name, node_name(host)]) for host in hostfile.hosts]
    if hostfile.router is not None and "router" in layers:
        groups.append((ROUTER_NODE, [ROUTER_NODE]))
    return groups


# What the checks' pytest runs with: testinfra reads gpunode's ansible.cfg for its SSH options (one
# shared connection per machine: the ControlPath, in a folder that must exist for testinfra to use
# it); and pytest loads only the plugin the checks need (testinfra's, given by name), where it would
# import every installed one (hypothesis, xdist, anyio...) at each start: seconds on a small machine.
CHECK_ENV = {"ANSIBLE_CONFIG": str(ANSIBLE_CFG), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_group(inventory_file: Path, files: list[str], hosts: list[str]) -> CheckReport:
    """The checks of ``files`` on ``hosts`` (inventory names), in this process."""
    import pytest

    collector = _Collector()
    # testinfra's ansible backend calls ansible-inventory: the one beside this interpreter.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    control_path_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    args = ["-p", "testinfra.plugin", *files, "--hosts=" + ",".join(f"ansible://{name}" for name in hosts),
            f"--ansible-inventory={inventory_file}", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
            str(CHECKS_DIR), "-q", "--no-header", "-rN"]
    errors = io.StringIO()
    with open(os.devnull, "w") as sink, _environment(CHECK_ENV):
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = sink, errors  # pytest's own report is ours to render
        try:
            code = int(pytest.main(args, plugins=[collector]))
        finally:
            sys.stdout, sys.stderr = saved
    report = collector.report
    if code == 2:
        report.interrupted = True
    if code in NOT_AN_OUTCOME:
        # pytest's last error line is the reason ("...: error: unrecognized arguments: --hosts=...").
        said = next((line.strip() for line in reversed(errors.getvalue().splitlines()) if "error" in line.lower()), "")
        hint = " (is pytest-testinfra installed? it provides --hosts)" if "--hosts" in said else ""
        report.error = f"no check ran: {NOT_AN_OUTCOME[code]}" + (f": {said[:300]}" if said else "") + hint
    elif not report.results:
        report.error = "no check ran: pytest collected and ran nothing"
    return report


def _group_in_subprocess(inventory_file: Path, files: list[str], hosts: list[str], out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpunode.checks.run", str(inventory_file), str(out), ",".join(hosts),
                             *files], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _report_from(data: dict[str, Any]) -> CheckReport:
    return CheckReport([result_from_dict(r) for r in data["results"]], data["error"], data["interrupted"])


def run_checks(hostfile: HostFile, secrets: inventory.SecretFiles, layers: list[str] | None = None) -> CheckReport:
    """Every chosen layer's checks: one host's in this process; several hosts' side by side, a
    pytest per host (with its GPU node) and one for the router, merged in the host file's order.
    No message holds a secret: the run's own values and secret-looking ones are hidden (a server's
    log line may carry its key)."""
    report = _run_checks(hostfile, secrets, layers)
    known = inventory.secret_values(secrets)
    for result in report.results:
        result.message = redact(result.message, known)
    report.error = redact(report.error, known)
    return report


def _run_checks(hostfile: HostFile, secrets: inventory.SecretFiles, layers: list[str] | None) -> CheckReport:
    folder = state_dir() / "check"
    folder.mkdir(parents=True, exist_ok=True)
    inv = inventory.write(hostfile, folder / "inventory.yml", secrets)
    chosen = layers or list(LAYERS)
    files = [str(CHECKS_DIR / f"test_{layer}.py") for layer in chosen if (CHECKS_DIR / f"test_{layer}.py").exists()]
    groups = check_groups(hostfile, chosen)
    if len(groups) == 1:
        return run_group(inv, files, groups[0][1])
    outs = {name: folder / f"report-{name}.json" for name, _ in groups}
    procs = {}
    try:
        for name, hosts in groups:
            outs[name].unlink(missing_ok=True)
            procs[name] = _group_in_subprocess(inv, files, hosts, outs[name])
        said = {name: proc.communicate()[1].decode(errors="replace") for name, proc in procs.items()}
    except KeyboardInterrupt:
        for proc in procs.values():
            proc.terminate()
        return CheckReport(interrupted=True)
    merged = CheckReport()
    for name, _hosts in groups:
        if not outs[name].is_file():
            merged.error = merged.error or f"no check ran for {name}: {tail(said[name]) or 'its pytest ended without a report'}"
            continue
        part = _report_from(json.loads(outs[name].read_text()))
        merged.results += part.results
        merged.interrupted |= part.interrupted
        if part.error and not part.results:
            merged.error = merged.error or f"{name}: {part.error}"
    return merged


def render(report: CheckReport, console: Console) -> None:
    marks = {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]", "pending": "[yellow]PEND[/yellow]",
             "skip": "[dim]SKIP[/dim]"}
    if report.error:
        console.print(f"[red]error:[/red] {escape(report.error)}", soft_wrap=True, highlight=False)
    for host, (why, count) in report.unreachable().items():
        console.print(f"[red]UNREACHABLE[/red] {escape(host)}: {escape(why)} ({count} checks not run)",
                      soft_wrap=True, highlight=False)
    for layer in LAYERS:
        rows = [r for r in report.results if r.layer == layer and r.status != "unreachable"]
        if not rows:
            continue
        console.print(f"[bold]{layer}[/bold]")
        for r in rows:
            line = f"  {marks[r.status]} {escape(r.host)}  {escape(r.name)}"
            if r.message:
                line += f": {escape(r.message)}"
            console.print(line, soft_wrap=True, highlight=False)
    c = report.counts()
    console.print(f"{c['pass']} passed, {c['fail']} failed, {c['pending']} pending, {c['skip']} skipped"
                  + (f", {c['unreachable']} not run (host unreachable)" if c["unreachable"] else ""), highlight=False)


def as_json(report: CheckReport) -> str:
    return json.dumps({"exit_code": report.exit_code, "error": report.error, "counts": report.counts(),
                       "unreachable": {host: why for host, (why, _) in report.unreachable().items()},
                       "results": [result_as_dict(r) for r in report.results]}, indent=2)


def main(argv: list[str]) -> int:
    """``python -m gpunode.checks.run INVENTORY OUT HOSTS FILE...``: one group's checks, its report as JSON in OUT."""
    inventory_file, out, hosts, *files = argv
    report = run_group(Path(inventory_file), files, hosts.split(","))
    Path(out).write_text(json.dumps({"results": [result_as_dict(r) for r in report.results], "error": report.error,
                                     "interrupted": report.interrupted}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
