"""The command line's edge (issue #31 item 6): names checked against the host file, conflicting
flags refused, --json answering with one JSON object on every outcome, errors as plain text on one
line each, usage errors on one line, -h and --version. Each case is refused before anything runs:
the playbook, the checks and the secrets are replaced by tripwires that fail the test if reached."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from gpunode import cli
from gpunode.cli import app
from gpunode.ground.stagelist import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventory" / "lab" / "host.yml"
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
STAGES = ", ".join(STAGE_NAMES)
FLEET_NAMES = "pve-lab1, pve-lab2, pve-lab1-ct202, pve-lab2-ct201, router"


class Reached(Exception):
    """A tripwire went off: the command got past its checks."""


@pytest.fixture(autouse=True)
def tripwires(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """Nothing past the checks may run: the playbook run, the checks, the lab's secret files. A
    playbook run records what it was asked, then stops the command."""
    from gpunode.checks import run as check
    from gpunode import runner
    from gpunode.rolling import roll
    from gpunode.stages.router.api import RouterUnavailable

    calls: list[dict[str, Any]] = []

    def provision(hostfile: object, stages: list[str], **kwargs: Any) -> None:
        calls.append({"stages": stages, **kwargs})
        raise Reached("the playbook would run")

    @contextmanager
    def no_secrets(hostfile: object) -> Iterator[dict[object, Path]]:
        yield {}

    def run_checks(*args: object) -> None:
        raise Reached("the checks would run")

    @contextmanager
    def no_router(hostfile: object) -> Iterator[None]:
        # A provision of a fleet's node reads the router before it runs (whether to roll): never
        # the lab's live fleet from a unit test, whose tests break and mend it meanwhile.
        raise RouterUnavailable("not read in a unit test")
        yield

    monkeypatch.setattr(runner, "provision", provision)
    monkeypatch.setattr(roll, "router_view", no_router)
    monkeypatch.setattr(runner, "secret_files", no_secrets)
    monkeypatch.setattr(check, "run_checks", run_checks)
    monkeypatch.setenv("GPUNODE_STATE_DIR", str(tmp_path / "state"))
    return calls


def gpunode(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(arg) for arg in args])


def refused(*args: str | Path, code: int = 2) -> str:
    """Run a command that must be refused: its exit code, nothing on stdout, one error line; returns
    the line without its prefix."""
    result = gpunode(*args)
    assert not isinstance(result.exception, Reached), f"{args} was not refused"
    assert result.exit_code == code, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0].removeprefix("error: ")


# -- names checked against the host file --------------------------------------------------------
def test_limit_names_a_host_of_the_file() -> None:
    assert refused("provision", FLEET, "--limit", "nope") == (
        f"{FLEET}: --limit: unknown host 'nope' (hosts: {FLEET_NAMES})")
    assert refused("provision", FLEET, "--limit", "pve-lab2,x,y") == (
        f"{FLEET}: --limit: unknown hosts 'x', 'y' (hosts: {FLEET_NAMES})")
    # The router is a name only where the file has one; a stage verb checks the same way.
    assert refused("host", LAB, "--limit", "router") == f"{LAB}: --limit: unknown host 'router' (hosts: pve-lab, pve-lab-ct200)"


@pytest.mark.parametrize("value", ["", " ", ",", "pve-lab,"])
def test_an_empty_limit_is_not_every_host(value: str) -> None:
    assert refused("provision", LAB, "--limit", value) == (
        f"--limit {value!r}: an empty host name (hosts: pve-lab, pve-lab-ct200)")


def test_good_names_reach_the_playbook(tripwires: list[dict[str, Any]]) -> None:
    result = gpunode("provision", FLEET, "--limit", "pve-lab2", "--tags", "host")
    assert isinstance(result.exception, Reached)
    assert tripwires[0]["limit"] == "pve-lab2,pve-lab2-ct201,router" and tripwires[0]["stages"] == ["host"]
    # --tags after --from's stage go together; a GPU node's own name is a --limit too.
    assert isinstance(gpunode("provision", FLEET, "--tags", "node, p2p", "--from", "container", "--limit",
                              "pve-lab1-ct202").exception, Reached)
    assert tripwires[1]["limit"] == "pve-lab1-ct202" and tripwires[1]["stages"] == ["node", "p2p"]


@pytest.mark.parametrize(("args", "line"), [
    (["--tags", ""], f"--tags '': an empty stage name (stages: {STAGES})"),
    (["--tags", "host,,node"], f"--tags 'host,,node': an empty stage name (stages: {STAGES})"),
    (["--tags", "host", "--tags", " "], f"--tags 'host, ': an empty stage name (stages: {STAGES})"),
    (["--tags", "nodes"], f"unknown stage 'nodes' (stages: {STAGES})"),
    (["--tags", "a,node,b"], f"unknown stages 'a', 'b' (stages: {STAGES})"),
    (["--from", ""], f"--from '': an empty stage name (stages: {STAGES})"),
    (["--from", "nodes"], f"unknown stage 'nodes' (stages: {STAGES})"),
])
def test_stages_are_named(args: list[str], line: str) -> None:
    assert refused("provision", LAB, *args) == line


@pytest.mark.parametrize(("value", "line"), [
    ("", f"--layer '': an empty layer name (layers: {STAGES})"),
    ("host,", f"--layer 'host,': an empty layer name (layers: {STAGES})"),
    ("gpu,x", f"unknown layers 'gpu', 'x' (layers: {STAGES})"),
])
def test_check_layers_are_named(value: str, line: str) -> None:
    assert refused("check", LAB, "--layer", value) == line


@pytest.mark.parametrize("value", ["", "1,,2", "1,0", "-4", "x"])
def test_bench_levels_are_whole_numbers(value: str) -> None:
    assert refused("bench", LAB, "--levels", value) == f"--levels {value!r}: give whole numbers of 1 or more separated by commas"


@pytest.mark.parametrize("command", [["p2p", "--local"], ["serve", "--local"], ["image", "build", "--local"],
                                     ["bench"]])
def test_host_names_a_host_of_the_file(command: list[str]) -> None:
    assert refused(*command, FLEET, "--host", "nope") == (
        f"{FLEET}: --host 'nope': no such host in the file; name one host with --host (pve-lab1, pve-lab2)")
    assert refused(*command, FLEET, "--host", "") == (
        f"{FLEET}: --host '': an empty name; name one host with --host (pve-lab1, pve-lab2)")
    assert refused(*command, FLEET) == f"{FLEET}: name one host with --host (pve-lab1, pve-lab2)"


# -- flags that cannot go together --------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--recreate-container", "--restart-container", "--adopt"])
def test_check_mode_refuses_what_allows_a_change(flag: str) -> None:
    assert refused("provision", LAB, "--check", flag) == (
        f"--check with {flag}: --check changes nothing, {flag} allows a change; give one or the other")


@pytest.mark.parametrize(("args", "line"), [
    (["--tags", "host,node,p2p", "--from", "node"],
     "--tags host with --from node: host comes before node and would not run; give --tags or --from"),
    (["--tags", "host,container", "--from", "node"],
     "--tags host,container with --from node: host, container come before node and would not run; give --tags or --from"),
    (["--tags", "node", "--restart-container"], "--restart-container: the container stage does that, and it is not selected"),
    (["--from", "node", "--recreate-container"], "--recreate-container: the container stage does that, and it is not selected"),
    (["--tags", "node", "--adopt"], "--adopt takes over a container: it needs the container stage, which is not selected"),
])
def test_provision_flags_that_conflict(args: list[str], line: str) -> None:
    assert refused("provision", LAB, *args) == line


@pytest.mark.parametrize(("args", "line"), [
    (["serve", "--local", LAB, "--limit", "pve-lab", "-vv"],
     "--limit, -v: not with --local (the serve stage's, on the node; --local runs here)"),
    (["p2p", "--local", "--check", "--limit", "pve-lab"],
     "--check, --limit: not with --local (the p2p stage's, on the node; --local runs here)"),
    (["smoke", "--local", "--url", "http://127.0.0.1:9", "-v"], "-v: not with --local (the smoke stage's, on the node; "
                                                               "--local runs here)"),
    (["smoke", "--local", "--url", "http://127.0.0.1:9", "--model-dir", "/m", "--docker-url", "unix:///x"],
     "--model-dir, --docker-url: only with --bench-image (the short bench's)"),
    (["p2p", "--local", "--host", "pve-lab"], "--host picks a host of the host file: give the host file too"),
    (["image", "verify", "some/tag:1", "--host", "pve-lab"], "--host picks a host of the host file: give it with --hosts"),
])
def test_local_flags_that_mean_nothing(args: list[str | Path], line: str) -> None:
    assert refused(*args) == line


# -- --json: one object on stdout whatever happens ----------------------------------------------
JSON_COMMANDS = {
    "plan": ["plan"], "provision": ["provision"], "check": ["check"], "p2p": ["p2p"], "serve": ["serve"],
    "smoke": ["smoke"], "diagnose": ["diagnose", "--hosts"], "image build": ["image", "build"],
    "image verify": ["image", "verify", "some/tag:1", "--hosts"],
    **{name: [name] for name in ("host", "container", "node", "model", "router", "monitor")},
}


def test_every_command_with_json_is_covered() -> None:
    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}".strip())
        if path:
            yield path, command

    with_json = {path for path, command in walk(get_command(app), "")
                 if any("--json" in getattr(param, "opts", ()) for param in command.params)}
    assert with_json == set(JSON_COMMANDS)


@pytest.mark.parametrize("name", sorted(JSON_COMMANDS))
def test_json_errors_are_one_object(name: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    result = gpunode(*JSON_COMMANDS[name], missing, "--json")
    assert result.exit_code == 2 and not isinstance(result.exception, Reached)
    assert json.loads(result.stdout) == {"error": f"{missing}: no such file", "errors": [f"{missing}: no such file"],
                                         "exit_code": 2}
    assert result.stderr == f"error: {missing}: no such file\n"


def test_json_error_of_a_bad_host_file_holds_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "host.yml"
    bad.write_text("version: 2\nhosts: []\n")
    result = gpunode("plan", bad, "--json")
    data = json.loads(result.stdout)
    problems = [line.removeprefix("error: ") for line in result.stderr.splitlines()]
    assert result.exit_code == 2 == data["exit_code"] and len(problems) == 2
    assert data["errors"] == problems and data["error"] == "; ".join(problems)


@pytest.mark.parametrize(("args", "line"), [
    (["provision", LAB, "--json", "--limit", ""], "--limit '': an empty host name (hosts: pve-lab, pve-lab-ct200)"),
    (["check", LAB, "--json", "--layer", "gpu"], f"unknown layer 'gpu' (layers: {STAGES})"),
    (["plan", LAB, "--json", "--bogus"], "No such option: --bogus (gpunode plan --help)"),
    (["p2p", "--json", "--local", "--size-mb", "x"], "Invalid value for '--size-mb': Input should be a valid integer, "
                                                   "unable to parse string as an integer (gpunode p2p --help)"),
    # serve --local prints nothing on stdout: --json cannot mean anything there.
    (["serve", "--local", LAB, "--json"], "--json: not with --local (the serve stage's, on the node; --local runs here)"),
    (["diagnose", "--json"], "give a log file, - for standard input, or --hosts HOST_FILE for the node's server log"),
])
def test_json_is_an_object_for_bad_flags_and_usage(args: list[str | Path], line: str) -> None:
    result = gpunode(*args)
    assert result.exit_code == 2 and result.stderr == f"error: {line}\n"
    assert json.loads(result.stdout) == {"error": line, "errors": [line], "exit_code": 2}


def test_json_only_where_the_command_takes_it() -> None:
    # validate has no --json: the usage error is text only, and says so.
    assert refused("validate", LAB, "--json").startswith("No such option: --json")


# -- errors are plain text, one line each -------------------------------------------------------
FORGED = "x\nerror: forged\x1b[31m\r\t\x07\x9b[/x][red]\u2028\u202e"
SHOWN = "x\\nerror: forged\\x1b[31m\\r\\t\\x07\\x9b[/x][red]\\u2028\\u202e"


def test_a_message_cannot_forge_a_line_or_reach_the_terminal(tmp_path: Path) -> None:
    # Values that reach a message as they are: a file name, an environment variable's name.
    assert refused("validate", FORGED) == f"{SHOWN}: no such file"
    assert refused("diagnose", tmp_path / FORGED) == f"{tmp_path}/{SHOWN}: No such file or directory"
    assert refused("smoke", "--local", "--url", "http://127.0.0.1:9", "--api-key-env", FORGED) == (
        f"--api-key-env: environment variable {SHOWN} is not set")


def test_rich_markup_in_a_name_is_printed_as_it_is(tmp_path: Path) -> None:
    # `[/x]` closed no tag and ended in MarkupError; `[red]` would have styled the rest.
    odd = tmp_path / "[/x]" / "[red]host[/red].yml"
    assert refused("plan", odd) == f"{odd}: no such file"


def test_one_line_escapes_every_control_character_and_keeps_the_rest() -> None:
    """The CLI prints each error through gpunode.ground.text.one_line."""
    from gpunode.ground.text import one_line

    controls = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)]))
    shown = one_line(controls)
    assert shown.isprintable() and shown.isascii() and shown.count("\\") == len(controls)
    assert one_line("a\nb") == "a\\nb" and one_line("\x1b[2J") == "\\x1b[2J"
    plain = "gpu→nœud 'x' [/x] ünïcode \\n"
    assert one_line(plain) == plain  # nothing printable changes, a backslash neither


# -- usage errors, -h, --version ---------------------------------------------------------------
@pytest.mark.parametrize(("args", "line"), [
    (["provision", "--nope"], "No such option: --nope (Possible options: --adopt) (gpunode provision --help)"),
    (["provision"], "Missing argument 'path'. (gpunode provision --help)"),
    (["image", "nope"], "No such command 'nope'. (gpunode image --help)"),
    (["bench", LAB, "--input-len", "0"], "Invalid value for '--input-len': Input should be greater than or "
                                         "equal to 1 (gpunode bench --help)"),
])
def test_usage_errors_are_one_line(args: list[str | Path], line: str) -> None:
    assert refused(*args) == line


def all_commands() -> list[list[str]]:
    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(get_command(app), []))


@pytest.mark.parametrize("path", all_commands(), ids=lambda path: " ".join(path) or "gpunode")
def test_h_is_help_on_every_command(path: list[str]) -> None:
    short, long = gpunode(*path, "-h"), gpunode(*path, "--help")
    assert short.exit_code == long.exit_code == 0
    assert short.stdout == long.stdout and f"Usage: {' '.join(['gpunode', *path])}" in short.stdout


def test_version_is_the_packages() -> None:
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", "gpunode", "--version"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stdout == f"gpunode {version('gpunode')}\n" and done.stderr == ""


def test_the_installed_entry_point_behaves_the_same(tmp_path: Path) -> None:
    # python -m gpunode goes through cli.main: the same one line, the same JSON, exit 2, nothing run.
    done = subprocess.run([sys.executable, "-m", "gpunode", "provision", str(LAB), "--check", "--adopt", "--json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "GPUNODE_STATE_DIR": str(tmp_path / "state")})
    line = "--check with --adopt: --check changes nothing, --adopt allows a change; give one or the other"
    assert done.returncode == 2 and done.stderr == f"error: {line}\n"
    assert json.loads(done.stdout) == {"error": line, "errors": [line], "exit_code": 2}
    assert not (tmp_path / "state").exists()
