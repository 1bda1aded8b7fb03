"""The model stage's hub path end to end in the lab: `gpunode provision inventory/lab/host.yml` fetches
the lab Hub's checkpoint (gpunode_lab.hub, a service on the lab Proxmox host's loopback, the real
huggingface_hub client on the other end) into the store on that host, the container stage mounts it
read-only in the node, and the server is started on it. What the acceptance of the model stage asks:
a fresh fetch, a second run that fetches and changes nothing, `--recreate-container` keeping the
weights, damaged shards named by `gpunode check` and fetched alone by provision, and the Hub's faults
(unreachable, revision not found, token refused, store too small) each named, fast, with no token in
any output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpunode_lab as lab
from gpunode_lab import hubservice
from gpunode_lab.contract import HUB_REPO, LAB_STORE

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
HOST = lab.HOST_CONTAINER
MODEL = yaml.safe_load(LAB_HOSTS.read_text())["hosts"][0]["model"]
REVISION = MODEL["revision"]
STORE = HOST.rootfs / LAB_STORE.lstrip("/") / HUB_REPO.replace("/", "--")  # the store, as seen from here
WEIGHTS = STORE / REVISION
MANIFEST = STORE / f"{REVISION}.manifest.json"
SHARDS = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]


def stop_container() -> None:
    """The lab's container 200 stopped through the Proxmox API, as a host reboot or `pct stop` leaves it."""
    from gpunode.stages.container.client import Connection, PveClient

    PveClient(Connection(url=lab.PVE_URL, node=lab.PVE_NODE, password=lab.PVE_PASSWORD_FILE.read_text().strip(),
                         ca_file=str(lab.PVE_CA))).call("POST", "nodes/pve1/lxc/200/status/stop")


def hub(method: str, path: str, body: Any = None) -> Any:
    return hubservice.call(HOST, method, path, body)


def served_files() -> list[str]:
    return sorted(f.name for f in hubservice.repo_dir(HOST).iterdir() if f.is_file() and not f.name.startswith("."))


def bodies() -> list[str]:
    """The files whose bytes the Hub sent since the log was cleared, one entry per GET with a body."""
    return sorted(e["file"] for e in hub("GET", "/_lab/log") if e["method"] == "GET" and e.get("file") and e["bytes_sent"])


def provision(gpunode, *args: str, hosts: Path = LAB_HOSTS) -> tuple[int, dict[str, Any], str]:
    result = gpunode("provision", str(hosts), "--json", *args, timeout=900)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout), result.stdout + result.stderr


def changed(summary: dict[str, Any]) -> int:
    return sum(summary["stats"].get("changed", {}).values())


def on_host(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(command, host=lab.HOST_CONTAINER_IP), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def on_node(command: str) -> str:
    return subprocess.run(lab.ssh_command(command), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL).stdout


def variant(tmp_path: Path, section: str = "model", **changes: Any) -> Path:
    """The lab host file with a section changed (a fault's own store, say, so that a fetch is due)."""
    data = yaml.safe_load(LAB_HOSTS.read_text())
    data["hosts"][0][section].update(changes)
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def converged(gpunode_module) -> None:
    result = gpunode_module("provision", str(LAB_HOSTS), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def record_restored(gpunode_module, converged: None) -> Any:
    """The faults record their variants' failures on the node; the lab host file puts its own record
    back once they are done, so that the tests after this module find a converged node."""
    yield
    result = gpunode_module("provision", str(LAB_HOSTS), "--tags", "model", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture
def fault_store(record_restored: None) -> Any:
    """A store of its own on the lab host for a fault's variant, removed after (it is not the mounted one)."""
    store = "/srv/gpunode-models-fault"
    yield store
    on_host(f"umount {store} 2>/dev/null; rm -rf {store}")


def test_the_lab_host_file_pins_the_commit_the_lab_hub_serves() -> None:
    assert (MODEL["source"], MODEL["endpoint"], REVISION) == ("hub", lab.contract.HUB_URL, hubservice.commit(HOST))


def record_of_node() -> dict[str, Any]:
    return json.loads(on_node("cat /etc/gpunode/model.json"))


def test_fresh_fetch_then_a_run_that_fetches_nothing_then_recreate_keeps_the_weights(gpunode, converged: None,
                                                                                     tmp_path: Path) -> None:
    # A fresh host's store: no store folder at all, the container not running (as before its first start).
    stop_container()
    shutil.rmtree(STORE)
    hub("DELETE", "/_lab/log")
    rc, first, out = provision(gpunode)
    assert rc == 0, first["failures"]
    assert bodies() == served_files(), "every file of the revision, each once"
    for name in served_files():
        assert (WEIGHTS / name).read_bytes() == (hubservice.repo_dir(HOST) / name).read_bytes(), name
    assert "hashed as fetched" in out and "PASS answer" in out, "verified, then served and smoke-tested"
    record = record_of_node()
    mount = on_node("grep ' /models/GLM-5-NVFP4 ' /proc/mounts")
    assert record["ok"] and record["revision"] == REVISION and " ro," in mount, (record, mount)

    hub("DELETE", "/_lab/log")
    rc, second, _ = provision(gpunode)
    assert rc == 0 and changed(second) == 0, second["stats"]
    assert hub("GET", "/_lab/log") == [], "a converged store asks the Hub nothing"

    # A smaller disk is a change only a new container can take (Proxmox grows a rootfs, never shrinks it).
    inode = (WEIGHTS / SHARDS[0]).stat().st_ino
    rc, again, out = provision(gpunode, "--recreate-container", hosts=variant(tmp_path, "container", disk_gb=6))
    assert rc == 0, again["failures"]
    assert "re-creating container 200 (--recreate-container): rootfs" in out, "the container was made again"
    assert bodies() == [], "nothing fetched again"
    assert record_of_node()["ok"] and "PASS answer" in out, "verified and served from the kept weights"
    assert (WEIGHTS / SHARDS[0]).stat().st_ino == inode, "the same file, not a copy"


def test_a_store_folder_deleted_under_the_running_container_is_named_and_never_served(gpunode, converged: None) -> None:
    """The revision's folder removed on the host while the container runs: the node's bind mount keeps
    the deleted folder. Check names it; provision fetches the revision again but the server refuses to
    start on the stale mount, naming the restart; after the restart (pct reboot) provision serves."""
    shutil.rmtree(WEIGHTS)
    result = gpunode("check", str(LAB_HOSTS), "--json", "--layer", "model", timeout=300)
    failed = {r["check"]: r["message"] for r in json.loads(result.stdout)["results"] if r["status"] == "fail"}
    assert result.returncode == 1 and "deleted on the Proxmox host" in failed.get("test_model_mount_is_live", ""), failed
    rc, refused, _ = provision(gpunode)
    message = " ".join(f["message"] for f in refused["failures"])
    assert rc == 1 and "serve: refused" in message and "pct reboot 200" in message, message
    assert (WEIGHTS / SHARDS[0]).is_file(), "the model stage fetched the revision again"
    stop_container()  # what `pct reboot` ends in: a new mount
    rc, served, _ = provision(gpunode)
    assert rc == 0, served["failures"]


def test_damaged_shards_are_named_by_check_and_fetched_alone_by_provision(gpunode, converged: None) -> None:
    """One shard deleted, one truncated, one with a byte flipped (its size and times as they were but
    for the ctime no one can set): each is named with its file, and provision fetches those three only."""
    (WEIGHTS / SHARDS[0]).unlink()
    os.truncate(WEIGHTS / SHARDS[1], 1000)
    flipped = WEIGHTS / SHARDS[2]
    times = flipped.stat()
    with open(flipped, "r+b") as handle:
        handle.seek(5000)
        byte = handle.read(1)
        handle.seek(5000)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(flipped, ns=(times.st_atime_ns, times.st_mtime_ns))
    result = gpunode("check", str(LAB_HOSTS), "--json", "--layer", "model", timeout=300)
    assert result.returncode == 1, result.stderr
    failed = {r["check"]: r["message"] for r in json.loads(result.stdout)["results"] if r["status"] == "fail"}
    message = failed["test_model_weights_verified"]
    for code, shard in zip(("missing", "size", "sha256"), SHARDS):
        assert f"{code} {shard}" in message, (code, message)
    assert "gpunode provision --tags model" in message

    hub("DELETE", "/_lab/log")
    rc, repaired, _ = provision(gpunode, "--tags", "model")
    assert rc == 0, repaired["failures"]
    assert bodies() == SHARDS, "the three damaged shards, each once, and nothing else"
    result = gpunode("check", str(LAB_HOSTS), "--json", "--layer", "model", timeout=300)
    assert result.returncode == 0, result.stdout


def fault(gpunode, hosts: Path) -> tuple[int, str, float]:
    start = time.monotonic()
    rc, summary, out = provision(gpunode, "--tags", "model", hosts=hosts)
    return rc, " ".join(f["message"] for f in summary["failures"]) + "\n" + out, time.monotonic() - start


def failed_task_seconds(summary: dict[str, Any]) -> list[float]:
    """How long each failed task ran, by ansible-runner's own events (start to end of the module)."""
    events = Path(summary["artifacts"]) / "job_events"
    return [float(event["event_data"]["duration"]) for event in
            (json.loads(path.read_text()) for path in sorted(events.glob("*.json")))
            if event.get("event") == "runner_on_failed"]


def test_hub_unreachable_is_exit_3_within_15_s(gpunode, converged: None, tmp_path: Path, fault_store: str) -> None:
    # The model stage's own run is timed (ansible-runner's event), not the whole command: on a loaded
    # 2-core machine the playbook's start alone took most of 18 s once.
    rc, summary, out = provision(gpunode, "--tags", "model", hosts=variant(tmp_path, endpoint="http://127.0.0.1:9",
                                                                            store=fault_store))
    text = " ".join(f["message"] for f in summary["failures"]) + "\n" + out
    seconds = failed_task_seconds(summary)
    assert rc == 3 and "did not answer" in text, (rc, text[-2000:])
    assert len(seconds) == 1 and seconds[0] < 15, (seconds, text[-2000:])


def test_revision_not_found_is_named(gpunode, converged: None, tmp_path: Path, fault_store: str) -> None:
    rc, text, _ = fault(gpunode, variant(tmp_path, revision="0" * 40, store=fault_store))
    assert rc == 1 and "revision not found" in text, text[-2000:]


def test_a_refused_token_is_named_and_in_no_output(gpunode, converged: None, tmp_path: Path, fault_store: str) -> None:
    canary = "hf_gpunodeCanaryToken0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(canary)
    token_file.chmod(0o600)
    hub("POST", "/_lab/faults", {"token": "hf_the_one_the_hub_takes"})
    try:
        rc, text, _ = fault(gpunode, variant(tmp_path, store=fault_store, token={"file": str(token_file)}))
    finally:
        hub("POST", "/_lab/faults", {"token": None})
    assert rc == 1 and "refused the token" in text, text[-2000:]
    assert canary not in text
    for kept in (tmp_path / "state").rglob("*"):
        if kept.is_file():
            assert canary.encode() not in kept.read_bytes(), kept


def test_a_store_too_small_is_refused_before_the_first_byte(gpunode, converged: None, tmp_path: Path,
                                                             fault_store: str) -> None:
    mounted = on_host(f"mkdir -p {fault_store} && mount -t tmpfs -o size=1m tmpfs {fault_store}")
    assert mounted.returncode == 0, mounted.stderr
    hub("DELETE", "/_lab/log")
    rc, text, _ = fault(gpunode, variant(tmp_path, store=fault_store))
    assert rc == 1 and "refused before the first byte" in text, text[-2000:]
    assert "free and the revision needs" in text and "bytes)" in text, "both sizes, exactly"
    assert bodies() == [], "not a byte fetched"
