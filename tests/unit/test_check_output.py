"""gpunode check's report: grouped by layer in build order, counts, --json, exit codes; bad input
is refused with a line per problem and exit 2 before any host is contacted."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from rich.console import Console

from gpunode.checks.run import CheckReport, as_json, render
from gpunode.ground.result import CheckResult
from gpunode.checks import LAYERS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import closed_port, session_closed_port  # noqa: E402 - tests/ put on the path just above

LAB = Path(__file__).resolve().parents[2] / "inventory" / "lab" / "host.yml"


def report() -> CheckReport:
    return CheckReport([
        CheckResult("test_server_healthy", "fail", "/health_generate answered 503 -> run x", layer="serve", host="node"),
        CheckResult("test_hmm_option_configured", "pass", layer="host", host="pve"),
        CheckResult("test_p2p_verdict", "skip", "lab: no GPU", layer="p2p", host="node"),
        CheckResult("test_host_finding[hmm]", "pending", "reload nvidia_uvm", layer="host", host="pve"),
    ])


def test_text_is_grouped_by_layer_in_build_order() -> None:
    out = io.StringIO()
    render(report(), Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line in LAYERS] == ["host", "p2p", "serve"]
    assert lines[1] == "  PASS pve  test_hmm_option_configured"
    assert lines[2] == "  PEND pve  test_host_finding[hmm]: reload nvidia_uvm"
    assert "  FAIL node  test_server_healthy: /health_generate answered 503 -> run x" in lines
    assert lines[-1] == "1 passed, 1 failed, 1 pending, 1 skipped"


def test_json_and_exit_code() -> None:
    data = json.loads(as_json(report()))
    assert data["exit_code"] == 1 and data["counts"] == {"pass": 1, "fail": 1, "pending": 1, "skip": 1, "unreachable": 0}
    assert data["results"][0] == {"layer": "serve", "host": "node", "check": "test_server_healthy",
                                  "status": "fail", "message": "/health_generate answered 503 -> run x"}
    passing = CheckReport([r for r in report().results if r.status != "fail"])
    assert passing.exit_code == 0, "pending and skipped checks do not fail the node"


def test_unknown_layer_is_bad_input(gpunode) -> None:
    result = gpunode("check", str(LAB), "--layer", "gpu")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: unknown layer 'gpu' (layers: host, container, node, model, image, p2p, "
                                     "serve, smoke, router, monitor)")


def test_malformed_host_file_is_bad_input(gpunode, tmp_path: Path) -> None:
    bad = tmp_path / "host.yml"
    bad.write_text("version: 2\nhosts: []\n")
    result = gpunode("check", str(bad), "--json")
    # --json: one JSON object on stdout on every outcome, errors included
    assert result.returncode == 2 and json.loads(result.stdout)["exit_code"] == 2
    # one line per problem, each naming the file, the key and the line
    assert result.stderr.splitlines() == [f"error: {bad}: version: must be 1 (line 1)",
                                          f"error: {bad}: hosts: needs at least 1 item(s) (line 2)"]
    assert not (tmp_path / "state").exists(), "nothing written for bad input"


# -- a check that checked nothing is never green ---------------------------------------------
EXAMPLE = LAB.parents[1] / "example" / "host.yml"


def loopback_hosts(tmp_path: Path, port: int | None = None) -> Path:
    """The example host file with every address on loopback, and the Proxmox API and every SSH port
    on ``port``, which the caller holds closed (without one: a port held closed for the rest of the
    test process)."""
    if port is None:
        port = session_closed_port()
    text = EXAMPLE.read_text().replace("https://192.0.2.10:8006", f"https://127.0.0.1:{port}")  # the API too
    text = text.replace("192.0.2.10", "127.0.0.1").replace("192.0.2.1\n", "127.0.0.1\n")
    text = text.replace("ip: 192.0.2.20/24", "ip: 127.0.0.5/8")
    text = text.replace("      user: root\n", f"      user: root\n      port: {port}\n", 1)
    text = text.replace("      ssh_public_keys:", f"      ssh: {{address: 127.0.0.1, port: {port}}}\n      ssh_public_keys:", 1)
    assert "192.0.2." not in text  # no traffic beyond this machine
    path = tmp_path / "host.yml"
    path.write_text(text)
    return path


def run_check(gpunode, tmp_path: Path, *args: str, addopts: str = "", **env: str):
    with closed_port() as port:  # held closed for the whole check: no other process can open it
        return gpunode("check", str(loopback_hosts(tmp_path, port)), *args, timeout=300,
                       env={"PVE_ROOT_PASSWORD": "not-used", "PYTEST_ADDOPTS": addopts, **env})


def test_no_check_collected_is_not_green(gpunode, tmp_path: Path) -> None:
    result = run_check(gpunode, tmp_path, addopts="-k no_check_has_this_name")
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == "error: no check ran: no check was collected"


def test_pytest_usage_error_is_not_green(gpunode, tmp_path: Path) -> None:
    """What a testinfra without its pytest plugin looks like: pytest refuses --hosts. (gpunode check
    loads the plugin by name, testinfra.plugin, with pytest's autoloading off; an empty testinfra
    first on the path stands in for a broken install.)"""
    shadow = tmp_path / "shadow" / "testinfra"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "plugin.py").write_text("")
    result = run_check(gpunode, tmp_path, "--json", PYTHONPATH=str(shadow.parent))
    data = json.loads(result.stdout)
    assert result.returncode == 4 and data["exit_code"] == 4 and not data["results"]
    assert data["error"].startswith("no check ran: pytest refused its arguments: ")
    assert "--hosts" in data["error"] and data["error"].endswith("(is pytest-testinfra installed? it provides --hosts)")


def test_unreachable_hosts_one_line_each_exit_3(gpunode, tmp_path: Path) -> None:
    result = run_check(gpunode, tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    unreachable = [line for line in lines if line.startswith("UNREACHABLE")]
    assert [line.split(":")[0] for line in unreachable] == ["UNREACHABLE pve1", "UNREACHABLE pve1-ct200"]
    for line in unreachable:
        assert "Connection refused" in line and line.endswith("checks not run)")
    assert not any(line.lstrip().startswith("FAIL") for line in lines)
    assert len(result.stdout.encode()) < 2048 * 2, result.stdout  # under 2 kB per host
    assert "CommandResult" not in result.stdout and "def gather" not in result.stdout


def test_report_exit_codes_for_unreachable_and_nothing_run() -> None:
    down = CheckReport([CheckResult("test_a", "unreachable", "ssh: connect: Connection refused", layer="host", host="pve"),
                        CheckResult("test_b", "unreachable", "ssh: connect: Connection refused", layer="host", host="pve"),
                        CheckResult("test_a", "pass", layer="host", host="other")])
    assert down.exit_code == 3 and down.unreachable() == {"pve": ("ssh: connect: Connection refused", 2)}
    assert CheckReport([*down.results, CheckResult("test_b", "fail", "x", layer="host", host="other")]).exit_code == 1
    assert CheckReport([]).exit_code == 4 and CheckReport([], error="no check ran: x").exit_code == 4
    out = io.StringIO()
    render(down, Console(file=out, width=200, color_system=None))
    assert out.getvalue().splitlines()[0] == "UNREACHABLE pve: ssh: connect: Connection refused (2 checks not run)"


def test_command_failure_shows_the_command_and_stderr_never_the_script() -> None:
    from gpunode.checks.run import command_failure

    script = "import json\\n" + "x = 1\\n" * 5000  # a facts script's body, as testinfra puts it in its repr
    text = (f"RuntimeError: CommandResult(backend=<testinfra.backend.ssh.SshBackend object at 0x7f>, exit_status=1, "
            f"command=b'python3 -c {script}', _stdout=b'', _stderr=b'Traceback (most recent call last):\\n"
            f"  File \"<string>\", line 1\\nPermissionError: [Errno 13] /sys/module/nvidia_uvm\\n')")
    line = command_failure(text)
    assert line == ("command `python3 -c import json...` failed (exit 1): "
                    "File \"<string>\", line 1 | PermissionError: [Errno 13] /sys/module/nvidia_uvm")
    assert "x = 1" not in line and len(line) <= 300


def test_our_message_wins_over_pytests_explanation() -> None:
    """A check's own failure message stays; the CommandResult in pytest's explanation below it is
    not ours to show."""
    from types import SimpleNamespace

    from gpunode.checks.run import _message

    crash = ("AssertionError: a container with the GPU hand-off did not start: no such image -> run `gpunode "
             "provision --tags node`\nassert 125 == 0\n +  where 125 = CommandResult(backend=<x>, exit_status=125, "
             "command=b'docker run --rm gpunode/probe:bookworm-1', _stdout=b'', _stderr=b'no such image').rc")
    report = SimpleNamespace(outcome="failed", longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=crash)))
    assert _message(report) == ("a container with the GPU hand-off did not start: no such image -> run "
                                "`gpunode provision --tags node`")
