"""`gpunode provision` for real: ansible-runner against the lab's LXC container.

Idempotence is read from ansible-runner's stats (the run's summary.json), never from text.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

import gpunode_lab as lab
from gpunode.stages.container.causes import HOST_STAGE_FIX

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
NODE = "pve-lab-ct200"


def _ssh(*remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _summary(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def _changed(summary: dict[str, Any]) -> int:
    return sum(summary["stats"].get("changed", {}).values())


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = LAB_HOSTS.read_text()
    assert old in text
    path = tmp_path / "host.yml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_converge_then_second_run_changes_nothing(gpunode, tmp_path: Path) -> None:
    # Make sure the first run has something to do, whatever state earlier runs left.
    _ssh("rm", "-f", "/etc/gpunode/node.json")
    first = gpunode("provision", str(LAB_HOSTS), "--json", timeout=600)
    assert first.returncode == 0, first.stderr
    one = _summary(first)
    assert one["status"] == "successful" and one["exit_code"] == 0
    assert one["stats"]["changed"].get(NODE, 0) >= 1
    assert one["stats"]["ok"][NODE] >= 10 and not one["stats"].get("failures")
    # Progress: the play, and each task with its host and result, were shown while running.
    assert "== node: set up the inside of the GPU container ==" in first.stderr
    assert f"changed {NODE}  Record what gpunode expects of this node" in first.stderr
    assert f"ok      {NODE}  Assert every selected GPU node is present with its major:minor" in first.stderr

    second = gpunode("provision", str(LAB_HOSTS), "--json", timeout=600)
    assert second.returncode == 0, second.stderr
    two = _summary(second)
    assert _changed(two) == 0, two["stats"]
    assert two["stats"]["ok"][NODE] == one["stats"]["ok"][NODE]

    # The recap is kept beside the run's artifacts and as last-run.json, equal to runner's stats.
    state = tmp_path / "state"
    saved = json.loads((Path(two["artifacts"]) / "summary.json").read_text())
    assert saved["stats"] == two["stats"] == json.loads((state / "last-run.json").read_text())["stats"]
    assert Path(two["log"]).read_text().count("Assert the control nodes are present") == 1
    assert (Path(two["artifacts"]) / "job_events").is_dir()

    # What was recorded on the node is what the host file says.
    recorded = json.loads(_ssh("cat", "/etc/gpunode/node.json").stdout)
    assert recorded["gpus"] == [0, 1] and recorded["expected"]["served_name"] == "glm-5"

    # The server container serve started got the host's driver: libcuda.so.1 and nvidia-smi from
    # the tree, as real SGLang needs them (0.5.9 runs nvidia-smi at start).
    seen = _ssh("docker exec gpunode-sglang sh -c 'ls /usr/local/nvidia/lib64/libcuda.so.1 && command -v nvidia-smi "
                "&& nvidia-smi'")
    assert seen.returncode == 0, seen.stderr
    assert "/usr/local/nvidia/lib64/libcuda.so.1\n/usr/local/nvidia/bin/nvidia-smi\n" in seen.stdout
    assert "Driver Version: 580.159.04" in seen.stdout


def test_check_mode_reports_and_changes_nothing(gpunode) -> None:
    _ssh("rm", "-f", "/etc/gpunode/node.json")
    result = gpunode("provision", str(LAB_HOSTS), "--check", "--diff", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    summary = _summary(result)
    assert summary["check"] is True
    assert summary["stats"]["changed"][NODE] == 1  # "would change": the missing file
    assert _ssh("test", "-e", "/etc/gpunode/node.json").returncode == 1, "check mode wrote the file"
    # The node stage alone writes it back (the file is its record; the other stages need no run).
    repaired = _summary(gpunode("provision", str(LAB_HOSTS), "--tags", "node", "--json", timeout=600))
    assert repaired["stats"]["changed"][NODE] == 1
    assert _ssh("test", "-e", "/etc/gpunode/node.json").returncode == 0


def test_missing_gpu_fails_with_host_task_and_fix(gpunode, tmp_path: Path) -> None:
    hosts = _variant(tmp_path, "gpus: [0, 1]", "gpus: [0, 1, 2]")
    # The TP size must equal the GPUs given (hostfile rule): three of each.
    hosts.write_text(hosts.read_text().replace('"--tp-size": 2', '"--tp-size": 3', 1))
    # The container stage finds it first, on the host, before anything is written.
    result = gpunode("provision", str(hosts), timeout=600)
    assert result.returncode == 1, result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed:")]
    assert failed == ["failed: pve-lab | Converge the GPU container through the Proxmox API | GPU device nodes: "
                      "selected GPU node(s) /dev/nvidia2 not on the host (it has: /dev/nvidia0, /dev/nvidia1): fix "
                      f"container.gpus, or {HOST_STAGE_FIX}; nothing was changed"]
    # Inside the container, the node stage checks the hand-off itself.
    result = gpunode("provision", str(hosts), "--tags", "node", timeout=600)
    assert result.returncode == 1, result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1
    assert NODE in failed[0] and "Assert every selected GPU node is present" in failed[0]
    assert "/dev/nvidia2 is missing" in failed[0] and "--from container" in failed[0]
    assert "Traceback" not in result.stderr


def test_unreachable_node_exit_3(gpunode, tmp_path: Path) -> None:
    # sshd listens on 22 only: port 2 on the lab container refuses at once.
    hosts = _variant(tmp_path, "        address: 10.0.3.10\n", "        address: 10.0.3.10\n        port: 2\n")
    result = gpunode("provision", str(hosts), "--json", timeout=600)
    assert result.returncode == 3, result.stderr
    summary = _summary(result)
    assert summary["stats"]["dark"][NODE] == 1
    assert summary["failures"][0]["message"].startswith("unreachable:")


def test_stage_selection(gpunode, tmp_path: Path) -> None:
    # A lab run leaves out what the lab cannot run, and says why, stage by stage: with the stand-in
    # server only p2p; without it, every GPU-side stage.
    by_from = gpunode("provision", str(LAB_HOSTS), "--from", "node", "--json", timeout=600)
    assert by_from.returncode == 0 and _summary(by_from)["stages"] == ["node", "model", "image", "serve", "smoke"]
    assert "lab: not running stage p2p: the lab has no GPU behind its node" in by_from.stderr
    assert "not running stage serve" not in by_from.stderr
    bare = _variant(tmp_path, "      lab_stand_in: fake-sglang\n", "")
    by_from = gpunode("provision", str(bare), "--from", "node", "--json", timeout=600)
    assert by_from.returncode == 0 and _summary(by_from)["stages"] == ["node", "model"]
    for stage, why in (("image", "no CUDA 12.8 nvcc"), ("p2p", "no GPU"), ("serve", "no GPU"), ("smoke", "no GPU")):
        assert f"lab: not running stage {stage}: " in by_from.stderr and why in by_from.stderr
    unknown = gpunode("provision", str(LAB_HOSTS), "--tags", "nodes")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "error: unknown stage 'nodes' (stages: host, container, node, model, image, p2p, serve, smoke, router, monitor)"
    # Named with --tags, a GPU stage runs, and says what is missing.
    forced = gpunode("provision", str(LAB_HOSTS), "--tags", "p2p", "--json", timeout=600)
    assert forced.returncode == 1
    message = _summary(forced)["failures"][0]["message"]
    assert message.startswith("p2p: the image gpunode/sglang:") and "--tags image" in message
    # Before it, the play read the PCIe fabric on the node's Proxmox host, and only the fabric (#35).
    events = [json.loads(path.read_text()) for path in (Path(_summary(forced)["artifacts"]) / "job_events").glob("*.json")]
    read = [e["event_data"] for e in events if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Read the PCIe fabric under the GPUs on the node's Proxmox host"]
    assert len(read) == 1, [e["event_data"].get("task") for e in events if e.get("event") == "runner_on_ok"]
    assert read[0]["res"]["_ansible_delegated_vars"]["ansible_host"] == lab.HOST_CONTAINER_IP  # the Proxmox host
    assert list(read[0]["res"]["facts"]) == ["fabric"] and read[0]["res"]["facts"]["fabric"]["gpus"]


def test_a_server_bound_to_the_nodes_own_address_is_probed_and_smoke_tested_there(gpunode, tmp_path: Path) -> None:
    """Docker publishes the server's port on its bind address only: bound to the node's own address, the
    server is not on the node's loopback, and serve's readiness probe and smoke's requests (through
    their SSH forwards) go to that address. Smoke failed with 'cannot connect' here before."""
    key = tmp_path / "api-key"
    key.write_text(secrets.token_hex(16) + "\n")
    key.chmod(0o600)
    hosts = _variant(tmp_path, "    server:\n", f"    server:\n      bind: {lab.CONTAINER_IP}\n      api_key: {{file: {key}}}\n")
    try:
        moved = gpunode("provision", str(hosts), "--tags", "serve,smoke", "--json", timeout=600)
        assert moved.returncode == 0, moved.stderr[-3000:]
        assert f"server: ready at http://{lab.CONTAINER_IP}:30000" in moved.stderr
        assert "PASS bench: 8/8 requests" in moved.stderr, moved.stderr[-3000:]
        # Published on that address only: nothing answers on the node's loopback.
        loopback = _ssh("python3", "-c", shlex.quote("import socket; socket.create_connection(('127.0.0.1', 30000), 2)"))
        assert loopback.returncode != 0 and "ConnectionRefusedError" in loopback.stderr, loopback.stderr
    finally:
        back = gpunode("provision", str(LAB_HOSTS), "--tags", "serve,smoke", "--json", timeout=600)
    assert back.returncode == 0, back.stderr[-3000:]


def test_secret_values_stay_out_of_output_logs_and_artifacts(gpunode, tmp_path: Path) -> None:
    # The real API password, given through the environment: it is used (the login works) and
    # appears nowhere: not in output, the log, the inventory, runner's artifacts or its env dump.
    lab_password = lab.PVE_PASSWORD_FILE.read_text().strip()
    hosts = _variant(tmp_path, "password: {file: /var/lib/gpunode-lab/pve/password}", "password: {env: GPUNODE_TEST_PVE_PASS}")
    result = gpunode("provision", str(hosts), "--json", "--diff", "-vvv", env={"GPUNODE_TEST_PVE_PASS": lab_password},
                     timeout=600)
    assert result.returncode == 0, result.stderr
    summary = _summary(result)
    assert summary["stats"]["ok"]["pve-lab"] >= 3, "the container stage logged in and ran"
    assert lab_password not in result.stdout + result.stderr
    files = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files), "ansible-runner's command file (which holds the env) exists"
    assert any(p.name == "gpunode.yml" for p in files), "the inventory is among the files checked"
    for path in files:
        assert lab_password.encode() not in path.read_bytes(), path
    # The env secret lived in memory only (runner.secret_files): no file in /dev/shm holds it.
    assert not [p for p in Path("/dev/shm").rglob("*") if p.is_file() and lab_password.encode() in p.read_bytes()]


def test_missing_env_secret_is_bad_input(gpunode, tmp_path: Path) -> None:
    hosts = _variant(tmp_path, "password: {file: /var/lib/gpunode-lab/pve/password}", "password: {env: GPUNODE_UNSET_X}")
    result = gpunode("provision", str(hosts))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {hosts}: hosts[0] password: environment variable GPUNODE_UNSET_X is not set"
    assert not (tmp_path / "state").exists()


def test_plan_says_lab_plainly(gpunode) -> None:
    result = gpunode("plan", str(LAB_HOSTS), "--json")
    assert result.returncode == 0
    host = json.loads(result.stdout)["hosts"][0]
    assert host["lab"] is True
    assert "fakepve" in host["notes"][0] and "real lab LXC container at 10.0.3.10" in host["notes"][0]
    assert host["container"]["dev0"] == "/dev/nvidia0,mode=0666" and host["container"]["dev1"] == "/dev/nvidia1,mode=0666"


def test_limit_selects_hosts(gpunode) -> None:
    only = gpunode("provision", str(LAB_HOSTS), "--limit", NODE, "--json", timeout=600)
    assert only.returncode == 0 and _summary(only)["limit"] == NODE
    assert set(_summary(only)["stats"]["ok"]) == {NODE}
    # A name the host file does not have is refused before Ansible runs, listing the names there are.
    none = gpunode("provision", str(LAB_HOSTS), "--limit", "no-such-host", "--json", timeout=600)
    assert none.returncode == 2
    assert json.loads(none.stdout)["error"] == (f"{LAB_HOSTS}: --limit: unknown host 'no-such-host' "
                                                f"(hosts: pve-lab, {NODE})")
