"""devN keys that do not move, and the host's nodes checked before any write: against fakepve (a
real HTTPS server speaking the PVE 9 schema; ``fakepve.version`` set to model PVE 8)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.ansible_collections.gpunode.core.plugins.module_utils import nvidia_nodes
from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection, PveClient, PveError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.pve import ct_config as config  # noqa: E402 - tests/ put on the path just above

NODE = "pve1"
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MODESET = "/dev/nvidia-modeset"
HOST = [f"/dev/nvidia{i}" for i in range(8)] + list(CONTROL) + [MODESET]  # the Proxmox host's nodes


def devices(gpus: str | list[int], host: list[str] = HOST) -> dict[str, str]:
    return lxc.wanted_devices(host, gpus, False, CONTROL, (MODESET,))


def run(conn: Connection, gpus: str | list[int], **options: Any) -> lxc.Result:
    options.setdefault("host_nodes", HOST)
    return lxc.ensure(PveClient(conn, sleep=lambda _: None), NODE, config(), devices=devices(gpus), **options)


def keys_by_path(ct_config: dict[str, Any]) -> dict[str, str]:
    return {lxc.device_path(value): key for key, value in ct_config.items() if lxc.DEV_KEY.match(key)}


def writes(pve: Any) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in pve.requests if m != "GET" and not p.endswith("/access/ticket")]


def test_two_to_eight_to_four_gpus_control_nodes_never_move(fakepve: Any, conn: Connection) -> None:
    run(conn, [0, 1])
    ct = fakepve.ct(200)
    two = keys_by_path(ct.config)
    # A new container numbers GPUs first, then the control nodes, then nvidia-modeset.
    assert two == {"/dev/nvidia0": "dev0", "/dev/nvidia1": "dev1", "/dev/nvidiactl": "dev2",
                   "/dev/nvidia-uvm": "dev3", "/dev/nvidia-uvm-tools": "dev4", MODESET: "dev5"}
    fixed = {path: two[path] for path in (*CONTROL, MODESET, "/dev/nvidia0", "/dev/nvidia1")}

    predicted = run(conn, "all", check_mode=True)
    assert {c.how for c in predicted.changes} == {"set"} and all(c.before is None for c in predicted.changes)
    assert set(predicted.applies.values()) == {"live"} and not predicted.pending and not predicted.restart_needed

    eight = run(conn, "all")
    after = keys_by_path(ct.config)
    assert {path: after[path] for path in fixed} == fixed
    assert [after[f"/dev/nvidia{i}"] for i in range(2, 8)] == [f"dev{n}" for n in range(6, 12)]
    # Only new keys: PVE 9 hot-plugs each, nothing waits and nothing restarted.
    assert sorted(c.key for c in eight.changes) == sorted(f"dev{n}" for n in range(6, 12))
    assert not eight.restart_needed and eight.pending == [] and not eight.restarted and ct.status == "running"
    assert eight.applies == {f"dev{n}": "live" for n in range(6, 12)}

    four = run(conn, [0, 1, 2, 3])
    gone = {after[f"/dev/nvidia{i}"] for i in range(4, 8)}
    assert {c.key for c in four.changes} == gone and {c.how for c in four.changes} == {"delete"}
    assert set(four.pending) == gone and four.restart_needed  # a removed devN waits for the restart
    run(conn, [0, 1, 2, 3], allow_restart=True)
    final = keys_by_path(ct.config)
    assert final == {path: key for path, key in after.items() if path not in {f"/dev/nvidia{i}" for i in range(4, 8)}}


def test_pve8_predicts_every_devn_change_for_the_restart(fakepve: Any, conn: Connection) -> None:
    fakepve.version = "8.4.1"
    run(conn, [0, 1])
    predicted = run(conn, "all", check_mode=True)
    assert predicted.pve_version == "8.4.1"
    assert predicted.applies == {f"dev{n}": "restart" for n in range(6, 12)}
    assert predicted.pending == [f"dev{n}" for n in sorted(range(6, 12), key=str)]
    assert predicted.restart_needed and "Proxmox VE 8.4.1 hot-plugs no device (devN)" in predicted.warnings[0]
    assert not writes(fakepve)[2:], "check mode wrote nothing after the create and start"


def test_operators_own_devn_keeps_its_key(fakepve: Any, conn: Connection) -> None:
    run(conn, [0, 1])
    ct = fakepve.ct(200)
    ct.config["dev6"] = "/dev/dri/card0,mode=0660"  # another device, the operator's
    grown = run(conn, [0, 1, 2])
    assert ct.config["dev6"] == "/dev/dri/card0,mode=0660"
    assert ct.config["dev7"] == "/dev/nvidia2,mode=0666" and [c.key for c in grown.changes] == ["dev7"]
    assert all(c.key != "dev6" for c in run(conn, [0]).changes if c.how == "delete")


def test_a_second_key_for_one_path_is_deleted(fakepve: Any, conn: Connection) -> None:
    """The half-changed state of the issue: a control node passed twice."""
    run(conn, [0, 1])
    fakepve.ct(200).config["dev6"] = "/dev/nvidiactl,mode=0666"
    result = run(conn, [0, 1])
    assert [(c.key, c.how) for c in result.changes] == [("dev6", "delete")]
    assert fakepve.ct(200).config["dev2"] == "/dev/nvidiactl,mode=0666"


def test_place_devices_skips_keys_whose_delete_is_pending() -> None:
    live = {"dev0": "/dev/nvidia0,mode=0666"}
    wanted = {"/dev/nvidia0": "/dev/nvidia0,mode=0666", "/dev/nvidia1": "/dev/nvidia1,mode=0666"}
    assert lxc.place_devices(live, wanted) == {"dev0": wanted["/dev/nvidia0"], "dev1": wanted["/dev/nvidia1"]}
    # dev1 still runs in the container (its delete waits for the restart): not free for another path,
    current = {**live, "dev1": "/dev/nvidia-modeset,mode=0666"}
    assert lxc.place_devices(live, wanted, current)["dev2"] == wanted["/dev/nvidia1"]
    # ... and the path it passes takes it back, which undoes the delete.
    current = {**live, "dev1": "/dev/nvidia1,mode=0666"}
    assert lxc.place_devices(live, wanted, current) == {"dev0": wanted["/dev/nvidia0"], "dev1": wanted["/dev/nvidia1"]}


def test_a_devn_the_host_lost_is_refused_before_any_write(fakepve: Any, conn: Connection) -> None:
    run(conn, [0, 1])
    before = dict(fakepve.ct(200).config)
    count = len(writes(fakepve))
    host = [path for path in HOST if path != "/dev/nvidia1"]
    for check_mode in (True, False):
        c = PveClient(conn, sleep=lambda _: None)
        with pytest.raises(PveError) as caught:
            lxc.ensure(c, NODE, config(), devices=devices("all", host), host_nodes=host, check_mode=check_mode)
        message = str(caught.value)
        for part in ("dev1 (/dev/nvidia1)", "lacks", "nothing was changed", "gpunode provision --tags host",
                     "pct stop 200"):
            assert part in message, part
        assert "\n" not in message and c.writes == 0
    assert len(writes(fakepve)) == count and fakepve.ct(200).config == before
    # Stopped, the container drops the stale devN at once, and starts.
    PveClient(conn).call("POST", f"nodes/{NODE}/lxc/200/status/stop")
    result = lxc.ensure(PveClient(conn), NODE, config(), devices=devices("all", host), host_nodes=host)
    assert "dev1" not in fakepve.ct(200).config and result.started and not result.pending


def test_a_node_that_is_not_a_character_device_is_named() -> None:
    facts = {path: {"char": True} for path in HOST}
    facts["/dev/nvidia1"] = {"char": False}
    found, other = lxc.char_nodes(facts)
    assert "/dev/nvidia1" not in found and other == ["/dev/nvidia1"]
    with pytest.raises(ValueError, match=r"/dev/nvidia1 \(there, but not a character device\) not on the host"):
        lxc.wanted_devices(found, [0, 1], False, CONTROL, (), not_char=other)
    assert "/dev/nvidia1" not in lxc.wanted_devices(found, "all", False, CONTROL, ())
    assert lxc.char_nodes(["/dev/nvidia0"]) == (["/dev/nvidia0"], [])  # a plain list: taken as devices


def test_scan_counts_only_character_devices_as_gpus(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").write_text("")  # a regular file where a node should be
    found = nvidia_nodes.scan(str(tmp_path), try_open=False)
    assert found["gpus"] == [] and found["devices"]["/dev/nvidia0"]["char"] is False


def test_the_operators_nvidia_named_devices_are_left_alone(fakepve: Any, conn: Connection) -> None:
    """Only the NVIDIA nodes gpunode hands in are its to delete or to call lost: an NVSwitch node or
    an IMEX channel the operator passes through stays, though the host facts do not list it."""
    run(conn, [0, 1])
    theirs = {"dev20": "/dev/nvidia-caps-imex-channels/channel0", "dev21": "/dev/nvidia-nvswitchctl"}
    fakepve.ct(200).config.update(theirs)
    result = run(conn, [0, 1])
    assert not result.changes and not result.warnings
    assert {key: fakepve.ct(200).config[key] for key in theirs} == theirs
    assert lxc.lost_nodes(fakepve.ct(200).config, HOST) == {}
    assert not lxc.managed("/dev/nvidia-nvswitch0") and lxc.managed("/dev/nvidia-caps/nvidia-cap1")
    assert lxc.managed("/dev/nvidia12") and lxc.managed("/dev/nvidiactl") and lxc.managed(MODESET)


def test_net0_settings_the_host_file_drops_are_removed() -> None:
    live = {"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,type=veth,ip=192.0.2.20/24,gw=192.0.2.1,"
                    "ip6=2001:db8::20/64,gw6=2001:db8::1"}
    want = {"net0": "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1"}
    assert [(c.key, c.how) for c in lxc.compare(live, want)] == [("net0", "set")]
    assert lxc.compare({"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,type=veth,ip=192.0.2.20/24,"
                                "gw=192.0.2.1"}, want) == []


def test_a_yaml_boolean_in_the_config_is_sent_as_proxmox_takes_it(fakepve: Any, conn: Connection) -> None:
    client = PveClient(conn, sleep=lambda _: None)
    lxc.ensure(client, NODE, {**config(), "onboot": True, "protection": False}, devices=devices([0]),
               host_nodes=HOST)
    assert fakepve.ct(200).config["onboot"] == 1
    again = lxc.ensure(PveClient(conn, sleep=lambda _: None), NODE, {**config(), "onboot": True}, devices=devices([0]),
                       host_nodes=HOST)
    assert not again.changes
