"""What Proxmox applies to a running container at once and what waits for its restart, per
version (pve-container src/PVE/LXC/Config.pm vmconfig_hotplug_pending; devN hot-plug since 6.0.4,
PVE 9.0), and what `plan --live` reports from it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode import hostfile
from gpunode.stages.container import live, lxc
from gpunode.stages.container.client import Connection, PveClient, PveError, PveVersion

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.pve import ct_config as config  # noqa: E402 - tests/ put on the path just above

PVE8, PVE9 = PveVersion.parse("8.4.1"), PveVersion.parse("9.0.10")
NEW, CHANGED, DELETED = "new", "changed", "deleted"


def change(key: str, kind: str) -> lxc.Change:
    before = None if kind == NEW else "old"
    after = None if kind == DELETED else "new"
    return lxc.Change(key, before, after, "delete" if kind == DELETED else "set")


# (key, kind, on PVE 8, on PVE 9) for a running container.
ROWS = [
    ("dev6", NEW, "restart", "live"),
    ("dev2", CHANGED, "restart", "restart"),
    ("dev7", DELETED, "restart", "restart"),
    ("mp0", NEW, "live", "live"),
    ("mp0", CHANGED, "restart", "restart"),
    ("mp1", DELETED, "restart", "restart"),
    ("features", CHANGED, "restart", "restart"),
    ("features", NEW, "restart", "restart"),
    ("memory", CHANGED, "live", "live"),
    ("swap", DELETED, "live", "live"),
    ("cores", CHANGED, "live", "live"),
    ("hostname", CHANGED, "live", "live"),
    ("tags", CHANGED, "live", "live"),
    ("description", DELETED, "live", "live"),
    ("net0", CHANGED, "live", "live"),
    ("nameserver", CHANGED, "restart", "restart"),
]


@pytest.mark.parametrize("key, kind, pve8, pve9", ROWS)
def test_hotplug_rule_per_version(key: str, kind: str, pve8: str, pve9: str) -> None:
    assert lxc.hotplug(PVE8, change(key, kind), running=True) == pve8
    assert lxc.hotplug(PVE9, change(key, kind), running=True) == pve9
    # A stopped container takes every change into its config at once.
    assert lxc.hotplug(PVE8, change(key, kind), running=False) == "live"
    assert lxc.hotplug(PVE9, change(key, kind), running=False) == "live"


def test_new_means_new_to_the_running_config() -> None:
    # dev6 is gone from the pending view but still runs (its delete waits): setting it again is a change.
    assert lxc.hotplug(PVE9, change("dev6", NEW), running=True, current={"dev6": "/dev/nvidia6"}) == "restart"
    assert lxc.hotplug(PVE9, change("mp0", NEW), running=True, current={"dev6": "/dev/nvidia6"}) == "live"
    # Undoing a pending change is Proxmox's cleanup_pending, at once: the value it runs with set
    # again, or a key it does not run with deleted (a pending addition dropped).
    assert lxc.hotplug(PVE9, change("dev6", NEW), running=True, current={"dev6": "new"}) == "live"
    assert lxc.hotplug(PVE8, change("dev6", DELETED), running=True, current={}) == "live"
    assert lxc.hotplug(PVE8, change("dev6", DELETED), running=True, current={"dev6": "old"}) == "restart"


def test_resize_is_online() -> None:
    grow = lxc.Change("rootfs", "local-lvm:vm-200-disk-0,size=8G", "12G", "resize")
    assert lxc.hotplug(PVE8, grow, running=True) == "live"


@pytest.mark.parametrize("text, major, minor", [("9.0.10", 9, 0), ("8.4.1", 8, 4), ("9.1.0~1", 9, 1)])
def test_version_parsing(text: str, major: int, minor: int) -> None:
    version = PveVersion.parse(text)
    assert (version.major, version.minor) == (major, minor) and str(version) == text
    assert version.at_least(9) == (major >= 9)


def test_a_version_that_is_not_one_is_refused() -> None:
    with pytest.raises(PveError, match="'fake' is not a Proxmox VE version"):
        PveVersion.parse("fake")


def test_rule_lines_name_the_version() -> None:
    assert lxc.hotplug_rule(PVE9).startswith("Proxmox VE 9.0.10 applies a new device (devN) or mount point")
    assert "hot-plugs no device (devN)" in lxc.hotplug_rule(PVE8) and "8.4.1" in lxc.hotplug_rule(PVE8)


# -- check mode against fakepve ------------------------------------------------------------------
NODE = "pve1"
TREE_V1 = "/var/lib/gpunode/nvidia/580.159.04"
TREE_V2 = "/var/lib/gpunode/nvidia/580.172.08"
HOST = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def ensure(conn: Connection, gpus: list[int], tree: str, **options: Any) -> lxc.Result:
    devices = lxc.wanted_devices(HOST, gpus, False, tuple(HOST[2:]), ())
    return lxc.ensure(PveClient(conn, sleep=lambda _: None), NODE, options.pop("config", config()), devices=devices,
                      mounts=lxc.driver_mount(tree), host_nodes=HOST, **options)


@pytest.mark.parametrize("version", ["8.4.1", "9.0.10"])
def test_check_mode_predicts_by_the_servers_version(fakepve: Any, conn: Connection, version: str) -> None:
    fakepve.version = version
    ensure(conn, [0], TREE_V1)
    predicted = ensure(conn, [0, 1], TREE_V2, config=config(features="nesting=1"), check_mode=True)
    new_dev = "dev4"  # nvidia1 takes the lowest free key after nvidia0 and the three control nodes
    assert predicted.applies == {new_dev: "restart" if version.startswith("8") else "live",
                                 "mp0": "restart", "features": "restart"}
    assert set(predicted.pending) == {k for k, how in predicted.applies.items() if how == "restart"}
    assert f"Proxmox VE {version}" in predicted.warnings[0]


def test_check_mode_on_a_stopped_container_predicts_no_restart(fakepve: Any, conn: Connection) -> None:
    ensure(conn, [0], TREE_V1)
    PveClient(conn).call("POST", f"nodes/{NODE}/lxc/200/status/stop")
    predicted = ensure(conn, [0, 1], TREE_V2, config=config(features="nesting=1"), check_mode=True)
    assert set(predicted.applies.values()) == {"live"} and predicted.pending == [] and not predicted.restart_needed
    assert "would start container 200" in predicted.actions


# -- plan --live -----------------------------------------------------------------------------------
def lab_host() -> hostfile.Host:
    from pathlib import Path

    return hostfile.load(Path(__file__).resolve().parents[2] / "inventory/lab/host.yml").hosts[0]


def host_with(gpus: str | list[int]) -> hostfile.Host:
    lab = lab_host()
    return lab.model_copy(update={"container": lab.container.model_copy(update={"gpus": gpus})})


@pytest.mark.parametrize("gpus, note", [("all", live.ALL_GPUS_NOTE), ([0, 1], live.LISTED_NOTE)])
def test_plan_live_reports_version_and_what_applies_when(fakepve: Any, conn: Connection, gpus: Any,
                                                         note: str) -> None:
    host = host_with(gpus)
    vmid = host.container.vmid
    free = live.ownership(PveClient(conn), NODE, vmid, host)
    assert free.owner == "free" and free.pve_version == "9.0.10" and free.hotplug_rule == lxc.hotplug_rule(PVE9)

    wanted, _ = live.wanted(host_with([0, 1]), {})
    fakepve.add_ct(vmid, host.container.hostname, node=NODE, status="running",
                   config={**{k: v for k, v in wanted.fresh().items() if k not in lxc.CREATE_ONLY},
                           "rootfs": f"{host.container.storage}:vm-{vmid}-disk-0,size={host.container.disk_gb}G",
                           "features": "nesting=1"})
    seen = live.ownership(PveClient(conn), NODE, vmid, host)
    assert seen.owner == "gpunode" and seen.pve_version == "9.0.10" and seen.devices_note == note
    assert seen.applies_at_restart == ("features",) and seen.applies_live == ()
    assert not [(m, p) for m, p, _ in fakepve.requests if m != "GET" and not p.endswith("/access/ticket")]


def test_plan_live_with_listed_gpus_names_new_keys(fakepve: Any, conn: Connection) -> None:
    host = host_with([0, 1])
    vmid = host.container.vmid
    wanted, note = live.wanted(host, {})
    assert note == live.LISTED_NOTE
    existing = {k: v for k, v in wanted.fresh().items() if k not in lxc.CREATE_ONLY and k != "dev1"}
    existing["rootfs"] = f"{host.container.storage}:vm-{vmid}-disk-0,size={host.container.disk_gb}G"
    fakepve.add_ct(vmid, host.container.hostname, node=NODE, status="running", config=existing)
    seen = live.ownership(PveClient(conn), NODE, vmid, host)
    assert seen.applies_live == ("dev1",) and seen.applies_at_restart == ()
    fakepve.version = "8.4.1"
    assert live.ownership(PveClient(conn), NODE, vmid, host).applies_at_restart == ("dev1",)
