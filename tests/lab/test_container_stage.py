"""The container stage for real: Ansible, the project's module, and the lab's fakepve process.

Request counts come from the module's own return (every request the client sent), read from
ansible-runner's job events; changed counts from runner stats.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpunode_lab as lab
from gpunode.stages.container.causes import HOST_STAGE_FIX
from gpunode.stages.container.client import Connection, PveClient, PveError
from gpunode_lab import pve as labpve
from gpunode_lab.contract import SSH_PUBKEY

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
    mounts = sorted(value for key, value in config.items() if key.startswith("mp"))
    model = yaml.safe_load(LAB_HOSTS.read_text())["hosts"][0]["model"]
    weights = f"{model['store']}/{model['id'].replace('/', '--')}/{model['revision']}"
    assert mounts == [f"{weights},mp=/models/GLM-5-NVFP4,ro=1",  # the store's revision (model.source: hub)
                      "/var/lib/gpunode/nvidia/580.159.04,mp=/usr/local/nvidia,ro=1"], config
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
    # A second key for a node the container has (the lab host has it: Proxmox refuses a devN for a
    # node the host lacks): new, so hot-plugged; gpunode's is dev0, so dev6 is one to remove.
    api().call("PUT", "nodes/pve1/lxc/200/config", dev6="/dev/nvidia0,mode=0666")
    assert "dev6" in api().get("nodes/pve1/lxc/200/config", current=1)  # live at once
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


# ----------------------------------------------------------------------------- device hot-plug
# The lab's Proxmox hot-plugs a new devN into the running LXC container gpunode-lab as
# pve-container 6 does (a node made in a passthrough folder, bind-mounted onto a file created at
# its path) and refuses what Proxmox refuses (gpunode_lab.pverules). A third fake GPU
# (/dev/nvidia2, char 195:2) is made on the lab's Proxmox host for these tests only, and removed
# again with whatever they plugged, whatever happens.

CONFIG = "nodes/pve1/lxc/200/config"
GPU2 = "/dev/nvidia2"
DEV_KEY = re.compile(r"^dev\d+$")
TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"


def init_pid(name: str) -> int:
    out = subprocess.run(["lxc-info", "-P", str(lab.LXC_PATH), "-n", name, "-pH"], capture_output=True, text=True,
                         check=True, timeout=30).stdout.strip()
    return int(out)


def devices(config: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in config.items() if DEV_KEY.match(key)}


def three_gpus(tmp_path: Path) -> Path:
    """The lab host file with GPUs 0, 1 and 2 (and TP 3: the TP size equals the GPUs given)."""
    hosts = variant(tmp_path, "gpus: [0, 1]", "gpus: [0, 1, 2]")
    hosts.write_text(hosts.read_text().replace('"--tp-size": 2', '"--tp-size": 3', 1))
    return hosts


def _unplug_in_gpu_node() -> None:
    """What a plug left in gpunode-lab: the bind mount on /dev/nvidia2 and the file under it."""
    pid = init_pid(lab.CONTAINER_NAME)
    where = Path(f"/proc/{pid}/root{GPU2}")
    mounted = any(line.split()[4] == GPU2 for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines())
    if mounted:
        labpve._run_helper(["umount", str(pid), GPU2])
    if where.is_dir():
        where.rmdir()
    elif where.exists():
        where.unlink()


@pytest.fixture
def third_gpu(gpunode) -> Iterator[Path]:
    """/dev/nvidia2 on the lab's Proxmox host; gone again after, with container 200 back at two GPUs."""
    host_node = Path(f"/proc/{init_pid(lab.HOST_CONTAINER_NAME)}/root{GPU2}")
    with contextlib.suppress(FileNotFoundError):
        host_node.unlink()
    _unplug_in_gpu_node()
    os.mknod(host_node, stat.S_IFCHR | 0o666, os.makedev(lab.NVIDIA_MAJOR, 2))
    os.chmod(host_node, 0o666)
    try:
        yield host_node
    finally:
        try:
            # Back to the lab's two GPUs: a stopped container drops a devN at once, even one for a
            # node the host has lost by now.
            if any(int(ct["vmid"]) == 200 for ct in api().get("nodes/pve1/lxc")) and \
                    "dev6" in api().get(CONFIG, current=1):
                api().call("POST", "nodes/pve1/lxc/200/status/stop")
            assert run(gpunode)[0] == 0
        finally:
            with contextlib.suppress(FileNotFoundError):
                host_node.unlink()
            _unplug_in_gpu_node()


def test_a_gpu_added_to_the_running_container_is_live_and_checks_green(gpunode, third_gpu: Path,
                                                                         tmp_path: Path) -> None:
    assert run(gpunode)[0] == 0
    before = api().get(CONFIG)
    assert api().get("nodes/pve1/lxc/200/status/current")["status"] == "running"
    pid = init_pid(lab.CONTAINER_NAME)

    hosts = three_gpus(tmp_path)
    rc, summary, stderr = run(gpunode, hosts=hosts)
    assert rc == 0, stderr
    res = module_result(summary)
    # Only a new key: applied to the running container at once, nothing waits for a restart.
    assert res["pve_version"] == "9.0.10"
    assert res["applies"] == {"dev6": "live"}
    assert res["pending"] == [] and not res["restart_needed"] and not res["restarted"]
    after = api().get(CONFIG)
    assert devices(after) == {**devices(before), "dev6": f"{GPU2},mode=0666"}  # no key moved
    assert init_pid(lab.CONTAINER_NAME) == pid  # the LXC container was not restarted
    node = os.stat(f"/proc/{pid}/root{GPU2}")  # the GPU node sees the new GPU
    assert stat.S_ISCHR(node.st_mode) and os.major(node.st_rdev) == lab.NVIDIA_MAJOR and os.minor(node.st_rdev) == 2

    check = gpunode("check", str(hosts), "--layer", "container", timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr

    # A second run changes nothing.
    rc, again, _ = run(gpunode, hosts=hosts)
    assert rc == 0 and not again["stats"].get("changed") and module_result(again)["writes"] == 0

    # The host loses the node while the container runs with it: Proxmox would fail every update
    # (it stats every devN), so gpunode refuses before any write and says what to do.
    third_gpu.unlink()
    rc, lost, _ = run(gpunode)
    assert rc == 1
    message = lost["failures"][0]["message"]
    assert f"container 200 runs with dev6 ({GPU2}), which the Proxmox host lacks" in message
    assert "nothing was changed" in message and "pct stop 200" in message
    assert api().get(CONFIG) == after
    # As it says: stopped, the container drops it at once.
    api().call("POST", "nodes/pve1/lxc/200/status/stop")
    rc, fixed, stderr = run(gpunode)
    assert rc == 0, stderr
    assert devices(api().get(CONFIG)) == devices(before)


def test_a_failed_hotplug_is_reported_with_proxmox_text_and_what_to_do(gpunode, third_gpu: Path,
                                                                         tmp_path: Path) -> None:
    assert run(gpunode)[0] == 0
    before = api().get(CONFIG)
    pid = init_pid(lab.CONTAINER_NAME)
    # Something in the GPU node's way: a directory where the device's file would be created.
    Path(f"/proc/{pid}/root{GPU2}").mkdir()
    rc, summary, _ = run(gpunode, hosts=three_gpus(tmp_path))
    assert rc == 1
    message = summary["failures"][0]["message"]
    assert f"unable to hotplug dev6: failed to create '/proc/{pid}/root{GPU2}': Is a directory" in message
    assert "nothing of the change was written" in message and "pct stop <vmid>" in message
    assert "--restart-container cannot help" in message
    assert api().get(CONFIG) == before and "dev6" not in api().get(CONFIG, current=1)


def test_a_bad_ssh_key_is_refused_by_validate_as_the_lab_proxmox_refuses_it(gpunode, tmp_path: Path) -> None:
    good = SSH_PUBKEY.read_text().strip()
    keys = tmp_path / "keys.pub"
    keys.write_text(f"{good}\n# the CI key\n")
    hosts = variant(tmp_path, "      gpus: [0, 1]\n", f"      gpus: [0, 1]\n      ssh_public_keys: {keys}\n")
    result = gpunode("validate", str(hosts))
    assert result.returncode == 2 and result.stdout == ""
    assert f"hosts[0].container.ssh_public_keys: {keys} line 2: a comment line" in result.stderr
    # The lab's Proxmox checks with the real ssh-keygen, line by line, as Proxmox does: the same
    # text is refused, one request, and no container is made.
    client = api()
    with pytest.raises(PveError) as caught:
        client.call("POST", "nodes/pve1/lxc", vmid=291, ostemplate=TEMPLATE, hostname="gpunode-keys",
                    rootfs="local-lvm:8", **{"ssh-public-keys": keys.read_text()})
    assert caught.value.status == 500 and "SSH public key validation error" in str(caught.value)
    assert client.counts["POST"] == 2  # the login, and the one create: a deterministic 500 is not retried
    assert not any(int(ct["vmid"]) == 291 for ct in client.get("nodes/pve1/lxc"))
    keys.write_text(f"{good}\n")
    assert gpunode("validate", str(hosts)).returncode == 0


def test_a_gpu_node_the_host_lacks_is_refused_before_any_write(gpunode, tmp_path: Path) -> None:
    assert run(gpunode)[0] == 0
    before = api().get(CONFIG)
    hosts = three_gpus(tmp_path)
    host_node = Path(f"/proc/{init_pid(lab.HOST_CONTAINER_NAME)}/root{GPU2}")
    assert not host_node.exists()
    fix = f"fix container.gpus, or {HOST_STAGE_FIX}; nothing was changed"
    rc, summary, _ = run(gpunode, hosts=hosts)
    assert rc == 1
    assert summary["failures"][0]["message"] == (
        f"GPU device nodes: selected GPU node(s) {GPU2} not on the host (it has: /dev/nvidia0, /dev/nvidia1): {fix}")
    assert module_result(summary).get("requests") is None  # refused before the first request
    # A plain file at the node's path is named as such: Proxmox passes only a device node through.
    host_node.write_text("")
    try:
        rc, summary, _ = run(gpunode, hosts=hosts)
        assert rc == 1
        assert f"{GPU2} (there, but not a character device) not on the host" in summary["failures"][0]["message"]
    finally:
        host_node.unlink()
    assert api().get(CONFIG) == before
