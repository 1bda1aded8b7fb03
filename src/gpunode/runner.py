"""Run the gpunode.core collection's playbooks/provision.yml through ansible-runner with live progress and a recap.

Stats come from ansible-runner itself (``Runner.stats``) and are saved as JSON beside the run's
artifacts, so idempotence ("a second run changes nothing") is read from numbers, not text.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import difflib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpunode.ground import exitcodes
from gpunode.ground.result import PROGRESS_ENV

from gpunode import inventory
from gpunode.hostfile import HostFile
from gpunode.ground.paths import ANSIBLE_CFG, COLLECTIONS_PATH, PLAYBOOKS, state_dir
from gpunode.ground.redact import HIDDEN, redact

# Exit codes: gpunode.ground.exitcodes (README "Exit codes").
EXIT_OK = exitcodes.OK
EXIT_FAILED = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT
EXIT_UNREACHABLE = exitcodes.UNREACHABLE
EXIT_ENVIRONMENT = exitcodes.ENVIRONMENT
EXIT_INTERRUPTED = exitcodes.INTERRUPTED


@dataclass
class Failure:
    host: str
    task: str
    message: str


@dataclass
class RunSummary:
    ident: str
    status: str
    rc: int
    exit_code: int
    stages: list[str]
    check: bool
    limit: str | None
    stats: dict[str, dict[str, int]]
    failures: list[Failure] = field(default_factory=list)
    artifacts: str = ""
    log: str = ""
    # The host file's hosts (and "router") that failed or were unreachable, in the file's order:
    # what `--limit` re-runs.
    failed_hosts: list[str] = field(default_factory=list)

    def totals(self, host: str | None = None) -> dict[str, int]:
        keys = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored")
        return {key: sum(n for h, n in self.stats.get(key, {}).items() if host is None or h == host) for key in keys}

    def hosts(self) -> list[str]:
        return sorted({host for counts in self.stats.values() for host in counts})


def _message(res: dict[str, Any], known: tuple[str, ...] = ()) -> str:
    """The useful part of a failed task's result, on one line, secrets hidden."""
    return redact(_task_message(res), known)


def _task_message(res: dict[str, Any]) -> str:
    failed_items = [item for item in res.get("results") or [] if isinstance(item, dict) and item.get("failed")]
    if failed_items:
        # A loop: "One or more items failed" says nothing; the items' own messages do.
        return " | ".join(_task_message(item) for item in failed_items)
    parts = [" ".join(str(res.get("msg", "")).split())]
    for key in ("stderr", "module_stderr", "stdout"):
        text = str(res.get(key) or "").strip()
        if text and text not in parts[0]:
            parts.append(text.splitlines()[-1])
            break
    return " | ".join(part for part in parts if part) or "failed (no message)"


class Progress:
    """Turns ansible-runner events into progress lines, live counts and a list of failures."""

    def __init__(self, console: Console, log: TextIO, show_diff: bool = False, known: tuple[str, ...] = ()) -> None:
        self.console = console
        self.log = log
        self.show_diff = show_diff
        self.known = known  # the run's secret values: never shown, logged or kept in a failure
        self.counts = {"ok": 0, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 0}
        self.failures: list[Failure] = []
        self.play = ""
        self.task = ""
        self.status: Any = None

    def _emit(self, text: str, style: str | None = None) -> None:
        text = redact(text, self.known)
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        self.log.write(f"{stamp} {Text.from_markup(text).plain}\n")
        self.log.flush()
        self.console.print(f"[dim]{stamp}[/dim] {text}", style=style, highlight=False, markup=True, soft_wrap=True)

    def _diff(self, diff: Any) -> None:
        for item in diff if isinstance(diff, list) else [diff] if diff else []:
            before, after = item.get("before", ""), item.get("after", "")
            if not (isinstance(before, str) and isinstance(after, str)):
                continue
            lines = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                         str(item.get("before_header", "before")),
                                         str(item.get("after_header", "after")), lineterm="")
            for line in lines:
                style = "red" if line.startswith("-") else "green" if line.startswith("+") else "dim"
                self._emit(f"          [{style}]{escape(line)}[/{style}]")

    def _live(self) -> None:
        if self.status is not None:
            c = self.counts
            self.status.update(f"{self.play} | {self.task} | ok={c['ok']} changed={c['changed']} "
                               f"failed={c['failed']} unreachable={c['unreachable']}")

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = escape(data.get("host", ""))
        task = escape(data.get("task", ""))
        if kind == "playbook_on_play_start":
            self.play = escape(data.get("play", ""))
            self._emit(f"[bold]== {self.play} ==[/bold]")
        elif kind == "playbook_on_task_start":
            self.task = task
        elif kind == "runner_on_ok":
            changed = bool(data.get("res", {}).get("changed"))
            self.counts["changed" if changed else "ok"] += 1
            word = "[yellow]changed[/yellow]" if changed else "[green]ok     [/green]"
            res = data.get("res", {})
            self._emit(f"  {word} {host}  {task}")
            # Our modules' summaries (findings, actions) and debug messages are part of the progress.
            for line in str(res.get("gpunode_summary") or res.get("msg") if data.get("task_action", "").endswith("debug")
                            or res.get("gpunode_summary") else "").splitlines():
                self._emit(f"          {escape(line)}")
            for warning in res.get("warnings") or []:
                self._emit(f"  [magenta]warning[/magenta] {host}: {escape(' '.join(str(warning).split()))}")

        elif kind == "runner_on_file_diff" and self.show_diff:
            self._diff(data.get("diff"))
        elif kind == "runner_on_skipped":
            self.counts["skipped"] += 1
        elif kind == "runner_on_failed" and data.get("res", {}).get("gpunode_unreachable"):
            # An API module (run on localhost) that could not reach its host: unreachable, not failed.
            self.counts["unreachable"] += 1
            message = _message(data.get("res", {}), self.known)
            self.failures.append(Failure(data.get("host", ""), data.get("task", ""), f"unreachable: {message}"))
            self._emit(f"  [red]UNREACHABLE[/red] {host}  {task}: {escape(message)}")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self.counts["failed"] += 1
            message = _message(data.get("res", {}), self.known)
            self.failures.append(Failure(data.get("host", ""), data.get("task", ""), message))
            self._emit(f"  [red]FAILED [/red] {host}  {task}: {escape(message)}")
        elif kind == "runner_on_unreachable":
            self.counts["unreachable"] += 1
            message = _message(data.get("res", {}), self.known)
            self.failures.append(Failure(data.get("host", ""), data.get("task") or "connect", f"unreachable: {message}"))
            self._emit(f"  [red]UNREACHABLE[/red] {host}: {escape(message)}")
        self._live()
        return True


@contextlib.contextmanager
def stage_progress(path: Path, progress: Progress, every_s: float = 1.0) -> Iterator[None]:
    """Show the last line a stage appends to ``path`` (PROGRESS_ENV: the model stage's bytes, rate
    and ETA) as the live status line, and keep one line in ten in the log."""
    stop = threading.Event()

    def follow() -> None:
        offset, count = 0, 0
        while not stop.wait(every_s):
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    new = handle.read()
            except OSError:
                continue
            complete, newline, _partial = new.rpartition(b"\n")  # a line being written waits for its newline
            offset += len(complete) + len(newline)
            for line in complete.decode(errors="replace").splitlines():
                if progress.status is not None:
                    progress.status.update(escape(line))
                if count % 10 == 0:
                    progress.log.write(f"{dt.datetime.now().strftime('%H:%M:%S')}           {line}\n")
                count += 1

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class SecretUnavailable(Exception):
    """A secret the host file names cannot be read (bad input: exit 2)."""


@contextlib.contextmanager
def secret_files(hostfile: HostFile) -> Iterator[inventory.SecretFiles]:
    """Files holding the run's secrets, for modules to read; gone when the run ends, however it ends.

    ``file:`` secrets are used where they are; an ``env:`` secret is copied into an anonymous file
    in memory (memfd_create) that this process holds open, and modules read it at
    ``/proc/<pid>/fd/<n>``. So no value is ever an Ansible variable, an argument, part of the
    environment that ansible-runner records, or a file on any disk or tmpfs: the kernel frees it
    when this process ends, also when it is killed with SIGKILL.
    """
    held: list[int] = []
    try:
        paths: inventory.SecretFiles = {}
        for (host, field), ref in inventory.secret_refs(hostfile).items():
            where = inventory.secret_where(hostfile, host, field)
            if ref.file is not None:
                path = ref.file.expanduser()
                if not path.is_file():
                    raise SecretUnavailable(f"{where}: secret file {path} does not exist")
                paths[(host, field)] = path
            elif ref.env is not None:
                if ref.env not in os.environ:
                    raise SecretUnavailable(f"{where}: environment variable {ref.env} is not set")
                held.append(os.memfd_create(f"gpunode-secret-{field}", os.MFD_CLOEXEC))
                os.write(held[-1], os.environ[ref.env].encode())
                paths[(host, field)] = Path(f"/proc/{os.getpid()}/fd/{held[-1]}")
        yield paths
    finally:
        for fd in held:
            os.close(fd)


@contextlib.contextmanager
def without_env(names: set[str]) -> Iterator[None]:
    """Keep the host file's secret variables out of Ansible's environment.

    ansible-runner writes the child's full environment into artifacts/<ident>/command; a secret
    must never land there, so those variables are absent while the run lasts.
    """
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def scrub_artifacts(folder: Path, known: tuple[str, ...]) -> None:
    """Replace any of the run's secret values that reached ansible-runner's artifacts (a module's
    output that echoed one, say) in place: the artifacts outlive the run."""
    if not known or not folder.is_dir():
        return
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            cleaned = data
            for value in sorted(known, key=len, reverse=True):
                cleaned = cleaned.replace(value.encode(), HIDDEN.encode())
            if cleaned != data:
                path.write_bytes(cleaned)


# gpunode.core.mitogen_linear: Ansible's linear order and semantics, through Mitogen, which keeps one
# Python per machine that runs every module in memory, instead of a new interpreter unpacking and
# compiling AnsiballZ (0.2-0.3 s on a node, 0.8 s for a copy that changes nothing) per module run;
# and a GPU-side stage's code imported once, in Ansible's process, for the workers it forks.
# An operator who wants another says so the usual way (ANSIBLE_STRATEGY=linear: Ansible's own).
STRATEGY = "gpunode.core.mitogen_linear"


# Mitogen's debugging switches (mitogen/core.py, mitogen/master.py, ansible_mitogen/logging.py): its
# debug log prints each module call with its arguments (no_log ones too) into Ansible's output, and
# MITOGEN_ROUTER_DEBUG writes it to /tmp files on every machine, which outlive the run. A run never
# inherits them.
MITOGEN_DEBUG_ENV = ("MITOGEN_LOG_LEVEL", "MITOGEN_ROUTER_DEBUG", "MITOGEN_PROFILING", "MITOGEN_PROFILE_FMT",
                     "MITOGEN_DUMP_THREAD_STACKS")


def strategy_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Ansible's strategy for a run: gpunode's, unless ``environ`` (the operator's environment, which
    the run inherits) names one itself."""
    return {} if environ.get("ANSIBLE_STRATEGY") else {"ANSIBLE_STRATEGY": STRATEGY}


def _exit_code(status: str, progress: Progress) -> int:
    if status == "canceled":
        return EXIT_INTERRUPTED
    if status == "successful":
        return EXIT_OK
    if progress.failures and all(f.message.startswith("unreachable:") for f in progress.failures):
        return EXIT_UNREACHABLE
    if any(f.task != "ansible-playbook" for f in progress.failures):
        return EXIT_FAILED
    return EXIT_ENVIRONMENT  # runner error or timeout: ansible itself did not run the play


def provision(
    hostfile: HostFile,
    stages: list[str],
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    verbosity: int = 0,
    console: Console | None = None,
    secrets: inventory.SecretFiles | None = None,
    extravars: dict[str, Any] | None = None,
    vault_password_file: Path | None = None,
    adopt: bool = False,
) -> RunSummary:
    """Run the selected stages of playbooks/provision.yml; return the recap from runner stats.

    ``secrets`` come from ``secret_files(hostfile)``, entered by the caller before anything is
    written, so that a missing secret is bad input that changes nothing. ``adopt`` lets the
    container stage take over a container gpunode did not make, after showing the full diff from
    a pass that writes nothing (the container stage in check and diff mode).
    """
    console = console or Console(stderr=True)
    common: dict[str, Any] = dict(limit=limit, verbosity=verbosity, console=console, secrets=secrets,
                                  extravars={**(extravars or {}), "gpunode_adopt": adopt},
                                  vault_password_file=vault_password_file)
    if adopt and not check:
        console.print("adopt: what taking the container over changes (check mode, nothing written yet):",
                      markup=False)
        preview = _run(hostfile, ["container"], check=True, diff=True, **common)
        if preview.exit_code != 0:
            return preview
        console.print("adopt: converging and marking it now", markup=False)
    return _run(hostfile, stages, check=check, diff=diff or adopt, **common)


def _run(
    hostfile: HostFile,
    stages: list[str],
    check: bool,
    diff: bool,
    limit: str | None,
    verbosity: int,
    console: Console,
    secrets: inventory.SecretFiles | None,
    extravars: dict[str, Any],
    vault_password_file: Path | None,
) -> RunSummary:
    """One ansible-runner run of the selected stages."""
    import ansible_runner  # heavy: imported only when a run happens

    state = state_dir()
    private = state / "runner"
    (private / "inventory").mkdir(parents=True, exist_ok=True)
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ident = dt.datetime.now().strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    # Written fresh each run: the inventory holds names of secrets, never their values.
    (private / "inventory" / "gpunode.json").unlink(missing_ok=True)  # an earlier gpunode's, which Ansible would read too
    inventory_file = inventory.write(hostfile, private / "inventory" / "gpunode.yml", secrets)
    log_path = logs / f"provision-{ident}.log"

    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    if vault_password_file is not None:
        cmdline += ["--vault-password-file", str(vault_password_file)]
    canceled = {"flag": False}

    def on_sigint(signum: int, frame: Any) -> None:
        canceled["flag"] = True

    known = inventory.secret_values(secrets)
    with log_path.open("w", encoding="utf-8") as log:
        progress = Progress(console, log, show_diff=diff, known=known)
        progress._emit(f"provision: stages {', '.join(stages)}" + (" (check mode)" if check else "")
                       + (f", limit {limit}" if limit else ""))
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            debug = sorted(name for name in MITOGEN_DEBUG_ENV if name in os.environ)
            if debug:
                progress._emit(f"provision: not passing {', '.join(debug)} to Ansible: Mitogen's debug output "
                               "carries modules' arguments, secrets among them")
            with without_env(inventory.secret_env_names(hostfile) | set(MITOGEN_DEBUG_ENV)), \
                    (console.status("starting") if console.is_terminal else contextlib.nullcontext()) as status:
                progress.status = status
                progress_file = private / "stage-progress.log"
                with stage_progress(progress_file, progress):
                    runner = ansible_runner.run(
                        private_data_dir=str(private),
                        project_dir=str(PLAYBOOKS),
                        playbook="provision.yml",
                        inventory=str(inventory_file),
                        ident=ident,
                        tags=",".join(stages),
                        limit=limit,
                        extravars=extravars,
                        cmdline=" ".join(cmdline) or None,
                        verbosity=verbosity or None,
                        envvars={
                            # ansible-playbook from the same environment as this gpunode.
                            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                            # The gpunode.core collection, from the package itself (any folder, a wheel).
                            "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
                            "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS_PATH),
                            "ANSIBLE_FORCE_COLOR": "0",
                            **strategy_env(os.environ),
                            # The model stage appends its progress here; stage_progress shows it live.
                            PROGRESS_ENV: str(progress_file),
                        },
                        suppress_env_files=True,
                        quiet=True,
                        event_handler=progress,
                        cancel_callback=lambda: canceled["flag"],
                        rotate_artifacts=20,
                    )
        finally:
            signal.signal(signal.SIGINT, previous)
        status_text = "canceled" if canceled["flag"] else runner.status
        if status_text != "successful" and not progress.failures and status_text != "canceled":
            # Ansible did not get as far as a task: say what it printed instead.
            tail = (private / "artifacts" / ident / "stdout").read_text(errors="replace").strip().splitlines()[-3:]
            progress.failures.append(Failure("localhost", "ansible-playbook",
                                             redact(" | ".join(tail) or status_text, known)))
            progress._emit(f"  [red]FAILED [/red] ansible-playbook: {escape(progress.failures[-1].message)}")
        summary = RunSummary(
            ident=ident,
            status=status_text,
            rc=runner.rc if runner.rc is not None else -1,
            exit_code=_exit_code(status_text, progress),
            stages=stages,
            check=check,
            limit=limit,
            stats=runner.stats or {},
            failures=progress.failures,
            artifacts=str(private / "artifacts" / ident),
            log=str(log_path),
            failed_hosts=failed_hosts(hostfile, {failure.host for failure in progress.failures}),
        )
        log.write(f"ansible output: {summary.artifacts}/stdout\n")
    scrub_artifacts(private / "artifacts" / ident, known)
    record = json.dumps(asdict(summary), indent=2)
    (private / "artifacts" / ident / "summary.json").write_text(record)
    (state / "last-run.json").write_text(record)
    return summary


def failed_hosts(hostfile: HostFile, names: set[str]) -> list[str]:
    """The host file's hosts behind failed inventory names (a Proxmox host, its GPU node), and the router."""
    from gpunode.derive import ROUTER_NODE, node_name

    out = [host.name for host in hostfile.hosts if {host.name, node_name(host)} & names]
    return out + ([ROUTER_NODE] if ROUTER_NODE in names else [])


def print_recap(summary: RunSummary, console: Console) -> None:
    table = Table(title=f"recap ({summary.status}{', check mode' if summary.check else ''})")
    for column in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host in summary.hosts():
        t = summary.totals(host)
        table.add_row(host, str(t["ok"]), str(t["changed"]), str(t["failures"]), str(t["dark"]), str(t["skipped"]))
    console.print(table)
    for failure in summary.failures:
        console.print(f"[red]failed:[/red] {escape(failure.host)} | {escape(failure.task)} | {escape(failure.message)}", highlight=False, soft_wrap=True)
    if summary.failed_hosts:
        console.print(f"failed hosts: {', '.join(summary.failed_hosts)} (re-run just those: --limit "
                      f"{','.join(summary.failed_hosts)})", highlight=False, soft_wrap=True)
    console.print(f"log: {summary.log}\nartifacts: {summary.artifacts}", highlight=False)

