"""The container stage for real: Ansible, the project's module, and the lab's fakepve process.

Request counts come from the module's own return (every request the client sent), read from
ansible-runner's job events; changed counts from runner stats.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpunode.lab as lab
from gpunode.container.client import Connection, PveClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import closed_port  # noqa: E402 - tests/ put on the path just above

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
HOST = "pve-lab"
CONVERGE = "Converge the GPU container through the Proxmox API"


def api() -> PveClient:
    return PveClient(Connection(url=lab.PVE_URL, node=lab.PVE_NODE, password=lab.PVE_PASSWORD_FILE.read_text().strip(),
                                ca_file=str(lab.PVE_CA)))


def module_result(summary: dict[str, Any]) -> dict[str, Any]:
    """The converge task's result, from ansible-runner's job events."""
    for path in sorted((Path(summary["artifacts"]) / "job_events").glob("*.json")):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        if event["event"] in ("runner_on_ok", "runner_on_failed") and data.get("task") == CONVERGE:
            return data["res"]
    raise AssertionError("the converge task did not run")


def run(gpunode, *args: str, hosts: Path = LAB_HOSTS) -> tuple[int, dict[str, Any], str]:
    result = gpunode("provision", str(hosts), "--tags", "container", "--json", *args, timeout=600)
    return result.returncode, json.loads(result.stdout), result.stderr


def variant(tmp_path: Path, old: str, new: str) -> Path:
    text = LAB_HOSTS.read_text()
    assert old in text
    path = tmp_path / "host.yml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.fixture(scope="module", autouse=True)
def host_stage_ran(gpunode_module) -> None:
    """The container stage mounts the host's driver tree, which the host stage builds."""
    result = gpunode_module("provision", str(LAB_HOSTS), "--tags", "host", timeout=600)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def fresh_container() -> None:
    """Start from no container 200 in the lab's fakepve."""
    client = api()
    if any(int(ct["vmid"]) == 200 for ct in client.get("nodes/pve1/lxc")):
        client.call("POST", "nodes/pve1/lxc/200/status/stop")
        client.call("DELETE", "nodes/pve1/lxc/200", purge=1, force=1)


def test_create_then_zero_writes(gpunode, fresh_container: None) -> None:
    rc, first, _ = run(gpunode)
    assert rc == 0
    assert first["stats"]["changed"][HOST] == 1
    created = module_result(first)
    assert created["created"] and created["started"]
    config = api().get("nodes/pve1/lxc/200/config")
    assert config["dev0"] == "/dev/nvidia0,mode=0666" and config["dev1"] == "/dev/nvidia1,mode=0666"
    assert config["dev5"] == "/dev/nvidia-modeset,mode=0666"  # present on the lab host, so passed in
    assert config["mp0"] == "/var/lib/gpunode/nvidia/580.159.04,mp=/usr/local/nvidia,ro=1"
    assert api().get("nodes/pve1/lxc/200/status/current")["status"] == "running"

    rc, second, _ = run(gpunode)
    assert rc == 0 and not second["stats"].get("changed")
    again = module_result(second)
    assert again["writes"] == 0 and set(again["requests"]) <= {"GET", "POST"} and again["requests"]["POST"] == 1


def test_check_mode_and_drift(gpunode, fresh_container: None) -> None:
    rc, check, _ = run(gpunode, "--check")
    assert rc == 0 and check["stats"]["changed"][HOST] == 1
    assert module_result(check)["writes"] == 0
    assert not any(int(ct["vmid"]) == 200 for ct in api().get("nodes/pve1/lxc")), "check mode created it"
    assert run(gpunode)[0] == 0
    api().call("PUT", "nodes/pve1/lxc/200/config", memory=512, cores=1)
    rc, drift, stderr = run(gpunode, "--check", "--diff")
    assert rc == 0 and {c["key"] for c in module_result(drift)["changes"]} == {"memory", "cores"}
    assert "-memory: 512" in stderr and "+memory: 2048" in stderr
    assert api().get("nodes/pve1/lxc/200/config")["memory"] == 512
    rc, fixed, _ = run(gpunode)
    assert rc == 0 and fixed["stats"]["changed"][HOST] == 1
    assert api().get("nodes/pve1/lxc/200/config")["memory"] == 2048


def test_removed_device_needs_restart_and_says_so(gpunode) -> None:
    assert run(gpunode)[0] == 0
    api().call("PUT", "nodes/pve1/lxc/200/config", dev6="/dev/nvidia9,mode=0666")
    rc, result, stderr = run(gpunode)
    assert rc == 0
    res = module_result(result)
    assert res["restart_needed"] and res["pending"] == ["dev6"]
    assert "must restart to apply dev6" in stderr and "--restart-container" in stderr
    rc, restarted, _ = run(gpunode, "--restart-container")
    assert rc == 0 and module_result(restarted)["restarted"]
    assert "dev6" not in api().get("nodes/pve1/lxc/200/config")


def test_token_fails_before_any_write(gpunode, tmp_path: Path) -> None:
    hosts = variant(tmp_path, "method: password\n        user: root@pam\n        password: {file: /var/lib/gpunode-lab/pve/password}",
                    "method: token\n        user: root@pam\n        token_id: gpunode\n        token_secret: {file: /var/lib/gpunode-lab/pve/password}")
    rc, summary, stderr = run(gpunode, hosts=hosts)
    assert rc == 1
    failure = summary["failures"][0]
    assert failure["host"] == HOST and "root@pam only" in failure["message"]
    assert "password" in failure["message"] and "local" in failure["message"] and "Nothing was changed" in failure["message"]


def test_tls_refused_unless_ca_or_pin(gpunode, tmp_path: Path) -> None:
    no_ca = variant(tmp_path, "      tls:\n        ca_file: /var/lib/gpunode-lab/pve/ca.pem\n", "")
    rc, summary, _ = run(gpunode, hosts=no_ca)
    assert rc == 1 and "TLS verification failed" in summary["failures"][0]["message"]
    der = ssl.PEM_cert_to_DER_cert(lab.PVE_CA.read_text())
    digest = hashlib.sha256(der).hexdigest().upper()
    pin = ":".join(digest[i:i + 2] for i in range(0, 64, 2))
    pinned = variant(tmp_path, "ca_file: /var/lib/gpunode-lab/pve/ca.pem", f'fingerprint: "{pin}"')
    rc, summary, _ = run(gpunode, hosts=pinned)
    assert rc == 0, summary["failures"]


# -- ownership: someone else's container at the configured vmid --------------------------------
def foreign(unprivileged: int) -> dict[str, Any]:
    """Create someone else's running container at vmid 200 (no gpunode tag) and return its config."""
    client = api()
    upid = client.call("POST", "nodes/pve1/lxc", vmid=200, hostname="prod-db", memory=8192, cores=8, swap=512,
                       ostemplate="local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst", rootfs="local-lvm:8",
                       net0="name=eth0,bridge=vmbr0,ip=dhcp", unprivileged=unprivileged, onboot=0,
                       features="nesting=1,keyctl=1",
                       description="Production database\nowner: the DBA team", start=1)
    client.wait_task(upid)
    return dict(client.get("nodes/pve1/lxc/200/config"))


def test_unmarked_unprivileged_container_survives_recreate(gpunode, fresh_container: None) -> None:
    before = foreign(unprivileged=1)
    for extra in (["--recreate-container"], ["--recreate-container", "--adopt"]):
        rc, summary, stderr = run(gpunode, *extra)
        assert rc == 1, stderr
        assert "was not made by gpunode" in summary["failures"][0]["message"]
        assert api().get("nodes/pve1/lxc/200/config") == before  # digest included: not a byte written
    assert api().get("nodes/pve1/lxc/200/status/current")["status"] == "running"


def live_owner(gpunode, hosts: Path = LAB_HOSTS) -> tuple[int, dict[str, Any] | None, str]:
    result = gpunode("plan", str(hosts), "--live", "--json")
    owner = json.loads(result.stdout)["hosts"][0]["ownership"] if result.returncode == 0 else None
    return result.returncode, owner, result.stderr


def test_foreign_container_refused_then_adopted(gpunode, fresh_container: None) -> None:
    rc, owner, _ = live_owner(gpunode)
    assert rc == 0 and owner["owner"] == "free"
    before = foreign(unprivileged=0)
    rc, owner, _ = live_owner(gpunode)
    assert rc == 0 and owner["owner"] == "foreign" and "hostname prod-db" in owner["detail"]
    assert api().get("nodes/pve1/lxc/200/config") == before  # plan --live only reads
    rc, summary, stderr = run(gpunode)
    assert rc == 1
    message = summary["failures"][0]["message"]
    assert message.startswith("container 200 (hostname prod-db, running, description 'Production database') "
                              "was not made by gpunode") and "--adopt" in message and "\n" not in message
    assert api().get("nodes/pve1/lxc/200/config") == before

    rc, adopted, stderr = run(gpunode, "--adopt")
    assert rc == 0, adopted["failures"]
    # The diff came first, from a pass that wrote nothing, then the converge.
    check_pass, converge = stderr.index("check mode, nothing written yet"), stderr.index("converging and marking")
    assert check_pass < stderr.index("-hostname: prod-db") < converge
    assert "+tags: gpunode" in stderr and "-memory: 8192" in stderr
    config = api().get("nodes/pve1/lxc/200/config")
    assert config["tags"] == "gpunode" and config["hostname"] == "gpunode-lab" and int(config["memory"]) == 2048
    assert config["description"].splitlines()[0].startswith("gpunode: made for host pve-lab")
    assert "Production database" in config["description"]

    rc, again, _ = run(gpunode)
    assert rc == 0 and not again["stats"].get("changed"), again["stats"]
    assert module_result(again)["writes"] == 0 and not module_result(again)["pending"]
    assert live_owner(gpunode)[1]["owner"] == "gpunode"


def test_refused_api_is_unreachable(gpunode, tmp_path: Path) -> None:
    with closed_port(lab.PVE_HOST) as port:  # on the lab's API address, held closed for the test
        api = f"https://{lab.PVE_HOST}:{port}"
        hosts = variant(tmp_path, f"url: {lab.PVE_URL}", f"url: {api}")
        rc, summary, stderr = run(gpunode, hosts=hosts)  # how fast: benchmarks/bad_input.py
        assert rc == 3
        assert summary["failures"][0]["message"].startswith(f"unreachable: Proxmox API {api} unreachable")
        rc, _, stderr = live_owner(gpunode, hosts)
    assert rc == 3 and stderr.startswith(f"error: pve-lab: Proxmox API {api} unreachable")
    assert len(stderr.strip().splitlines()) == 1


def test_without_the_hosts_tree_nothing_is_written(gpunode) -> None:
    moved = "/var/lib/gpunode/nvidia/580.159.04"
    assert subprocess.run(lab.ssh_command(f"mv {moved} {moved}.away", host=lab.HOST_CONTAINER_IP)).returncode == 0
    try:
        before = api().get("nodes/pve1/lxc/200/config") if any(
            int(ct["vmid"]) == 200 for ct in api().get("nodes/pve1/lxc")) else None
        rc, summary, _ = run(gpunode)
        assert rc == 1
        message = summary["failures"][0]["message"]
        assert "driver tree /var/lib/gpunode/nvidia/580.159.04 is missing" in message
        assert "gpunode provision --tags host" in message and "Nothing was changed" in message
        if before is not None:
            assert api().get("nodes/pve1/lxc/200/config") == before
    finally:
        subprocess.run(lab.ssh_command(f"mv {moved}.away {moved}", host=lab.HOST_CONTAINER_IP))
