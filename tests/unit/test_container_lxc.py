"""The container stage's logic against fakepve: a real HTTPS server speaking the PVE 9 schema."""

from __future__ import annotations

import hashlib
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection, PveClient, PveError, TaskFailed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import closed_port  # noqa: E402 - tests/ put on the path just above

NODE = "pve1"
GPUS = ["/dev/nvidia0", "/dev/nvidia1"]
FOUND = GPUS + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def desired(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "vmid": 200, "hostname": "glm5", "ostemplate": "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst",
        "rootfs": "local-lvm:8", "cores": 4, "memory": 4096, "swap": 0,
        "net0": "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1", "features": "nesting=1,keyctl=1",
        "unprivileged": 0, "onboot": 1, "tags": lxc.OWNER_TAG, "description": lxc.mark_line("pve1"),
    }
    config.update(overrides)
    return config


DEVICES = lxc.wanted_devices(FOUND, "all", False, CONTROL, ("/dev/nvidia-modeset",))


def ensure(c: PveClient, node: str, config: dict[str, Any], **options: Any) -> lxc.Result:
    """lxc.ensure with the host's devices (FOUND) unless a test gives its own."""
    options.setdefault("devices", DEVICES)
    return lxc.ensure(c, node, config, **options)


def client(conn: Connection) -> PveClient:
    return PveClient(conn, sleep=lambda _: None)


def server_writes(pve: Any) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in pve.requests if m != "GET" and not p.endswith("/access/ticket")]


def test_create_then_second_run_reads_only(fakepve: Any, conn: Connection) -> None:
    first = ensure(client(conn), NODE, desired())
    assert first.created and first.started and first.changed
    ct = fakepve.ct(200)
    assert ct.status == "running"
    assert ct.config["dev0"] == "/dev/nvidia0,mode=0666" and ct.config["dev5"] == "/dev/nvidia-modeset,mode=0666"
    assert ct.config["features"] in ("nesting=1,keyctl=1", "keyctl=1,nesting=1")
    before = len(server_writes(fakepve))
    assert before >= 2  # the create and the start

    again = client(conn)
    second = ensure(again, NODE, desired())
    assert not second.changed and not second.changes and not second.restart_needed
    assert again.writes == 0
    assert len(server_writes(fakepve)) == before, "a converged run must send no write at all"
    assert set(again.counts) == {"GET", "POST"} and again.counts["POST"] == 1  # POST = the login ticket only


def test_check_mode_creates_nothing(fakepve: Any, conn: Connection) -> None:
    c = client(conn)
    result = ensure(c, NODE, desired(), check_mode=True)
    assert result.changed and result.created
    assert "would create container 200" in result.actions
    assert c.writes == 0 and not server_writes(fakepve)
    assert 200 not in [ct.vmid for ct in fakepve.cts]


def test_drift_is_shown_and_applied(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    # Someone changed things by hand: memory, a removed devN, an extra NVIDIA devN the host file
    # does not select.
    ct = fakepve.ct(200)
    ct.config["memory"] = 1024
    del ct.config["dev1"]
    ct.config["dev9"] = "/dev/nvidia7,mode=0666"
    check = ensure(client(conn), NODE, desired(), check_mode=True)
    keys = {c.key: c for c in check.changes}
    assert set(keys) == {"memory", "dev1", "dev9"}
    assert (keys["memory"].before, keys["memory"].after) == ("1024", "4096")
    assert keys["dev9"].how == "delete"
    assert check.restart_needed and ct.config["memory"] == 1024  # would need a restart; wrote nothing

    applied = ensure(client(conn), NODE, desired())
    assert applied.changed and ct.config["memory"] == 4096
    # devN changes on a running container wait for a restart, and we say so.
    # PVE hot-plugs a new devN into a running container; removing one waits for a restart.
    assert ct.config["dev1"] == "/dev/nvidia1,mode=0666"
    assert applied.restart_needed and applied.pending == ["dev9"]
    assert any("must restart" in w and "--restart-container" in w for w in applied.warnings)

    restarted = ensure(client(conn), NODE, desired(), allow_restart=True)
    assert restarted.restarted and not restarted.pending
    assert ct.config["dev1"] == "/dev/nvidia1,mode=0666" and "dev9" not in ct.config
    assert not ensure(client(conn), NODE, desired()).changed


def test_stopped_container_is_started(fakepve: Any, conn: Connection) -> None:
    fakepve.add_ct(200, "glm5", node=NODE, status="stopped", config={
        k: v for k, v in desired().items() if k not in ("vmid", "ostemplate", "rootfs")} | {
        "rootfs": "local-lvm:vm-200-disk-0,size=8G", **lxc.place_devices({}, DEVICES)})
    result = ensure(client(conn), NODE, desired())
    assert result.started and not result.created and fakepve.ct(200).status == "running"
    assert "starting container 200" in result.actions


def test_never_destroys_without_the_flag(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    with pytest.raises(PveError, match="unprivileged.*re-creating the container.*--recreate-container"):
        ensure(client(conn), NODE, desired(unprivileged=1))
    assert fakepve.ct(200).status == "running"
    shrink = desired(rootfs="local-lvm:4")
    with pytest.raises(PveError, match="rootfs"):
        ensure(client(conn), NODE, shrink)
    recreated = ensure(client(conn), NODE, desired(unprivileged=1), allow_recreate=True)
    assert recreated.created and int(fakepve.ct(200).config["unprivileged"]) == 1


def test_disk_grows_online(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    result = ensure(client(conn), NODE, desired(rootfs="local-lvm:12"))
    assert [c.how for c in result.changes] == ["resize"]
    assert "size=12G" in fakepve.ct(200).config["rootfs"]


def test_failing_create_task_leaves_nothing(fakepve: Any, conn: Connection) -> None:
    # The template is not on the storage: the create task ends in TASK ERROR.
    fakepve.store_file("local", "other.tar.zst", 1024, content="vztmpl")
    with pytest.raises(TaskFailed) as caught:
        ensure(client(conn), NODE, desired())
    assert "does not exist" in str(caught.value) and caught.value.exitstatus != "OK"
    assert caught.value.log_tail and "TASK ERROR" in caught.value.log_tail[-1]
    assert 200 not in [ct.vmid for ct in fakepve.cts]
    fakepve.store_file("local", "debian-12-standard_12.12-1_amd64.tar.zst", 1024, content="vztmpl")
    assert ensure(client(conn), NODE, desired()).created


@pytest.mark.fakepve(time_scale=0.05)
def test_interrupted_create_is_finished_on_rerun(fakepve: Any, conn: Connection) -> None:
    # A run killed right after sending the create: Proxmox's worker goes on without it.
    fakepve.ct_secs["create"] = 40  # 2 s at this time scale
    params = {**desired(), **lxc.place_devices({}, DEVICES)}
    upid = client(conn).call("POST", f"nodes/{NODE}/lxc", **params)
    assert upid.startswith("UPID:") and fakepve.ct(200).lock == "create"
    result = ensure(client(conn), NODE, desired())
    assert any("waiting for the create" in a for a in result.actions)
    assert fakepve.ct(200).status == "running" and not fakepve.ct(200).lock and result.started


def test_create_lock_without_a_task_names_the_fix(fakepve: Any, conn: Connection) -> None:
    fakepve.add_ct(200, "glm5", node=NODE, status="stopped", config={"hostname": "glm5"}, lock="create")
    c = client(conn)
    with pytest.raises(PveError, match="pct unlock 200 && pct destroy 200"):
        ensure(c, NODE, desired())
    assert c.writes == 0


def test_locked_container_is_reported_not_forced(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    fakepve.ct(200).lock = "backup"
    c = client(conn)
    with pytest.raises(PveError, match=r"locked \(backup\).*pct unlock 200"):
        ensure(c, NODE, desired(memory=8192))
    assert c.writes == 0


def test_expired_ticket_logs_in_again(fakepve: Any, conn: Connection) -> None:
    c = client(conn)
    ensure(c, NODE, desired())
    fakepve.revoke_tickets()
    result = ensure(c, NODE, desired(memory=8192))
    assert result.changed and fakepve.ct(200).config["memory"] == 8192
    assert c.counts["POST"] >= 3  # first login, create/start, second login


def test_5xx_on_reads_is_retried_4xx_is_not(fakepve: Any, conn: Connection) -> None:
    fakepve.fail("GET", f"/nodes/{NODE}/lxc", 503, "service busy", times=2)
    result = ensure(client(conn), NODE, desired())
    assert result.created
    fakepve.fail("GET", f"/nodes/{NODE}/lxc", 400, "bad things", times=1)
    listed = len([p for m, p, _ in fakepve.requests if m == "GET" and p.endswith(f"/nodes/{NODE}/lxc")])
    c = client(conn)
    with pytest.raises(PveError, match="HTTP 400") as caught:
        ensure(c, NODE, desired())
    after = len([p for m, p, _ in fakepve.requests if m == "GET" and p.endswith(f"/nodes/{NODE}/lxc")])
    assert after == listed + 1 and c.counts["GET"] == 2 and not caught.value.retryable  # /version, then the list


def test_transient_5xx_on_a_write_rereads_before_retrying(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    # Another task held the config lock: PVE's own 500 (pve-common Tools.pm lock_file_full).
    fakepve.fail("PUT", "/lxc/200/config", error="config_lock_timeout", times=1)
    c = client(conn)
    result = ensure(c, NODE, desired(memory=2048))
    assert fakepve.ct(200).config["memory"] == 2048
    assert any(a.startswith("retrying after") for a in result.actions)
    assert c.counts["PUT"] == 2


def test_slow_and_flaky_network(fakepve: Any, conn: Connection) -> None:
    fakepve.slow_network(0.05)
    fakepve.flaky_network(drop_rate=0.1, seed=7)
    result = ensure(client(conn), NODE, desired())
    assert fakepve.ct(200).status == "running" and result.created


def test_token_is_refused_before_any_request(fakepve: Any, fakepve_cafile: str) -> None:
    fakepve.apitokens["root@pam!gpunode"] = "tok-secret"
    token = Connection(url=fakepve.url, node=NODE, method="token", token_id="gpunode", token_secret="tok-secret",
                       ca_file=fakepve_cafile)
    c = PveClient(token)
    with pytest.raises(PveError) as caught:
        ensure(c, NODE, desired())
    assert "root@pam only" in str(caught.value) and "auth.method password" in str(caught.value)
    assert "auth.method local" in str(caught.value)
    assert sum(c.counts.values()) == 0 and not fakepve.requests


def test_server_refuses_devn_for_a_token(fakepve: Any, fakepve_cafile: str) -> None:
    # If a token got as far as a write, PVE's own refusal is reported clearly.
    fakepve.apitokens["root@pam!gpunode"] = "tok-secret"
    fakepve.acl = {}
    fakepve.grant("root@pam!gpunode", "/", "VM.Allocate", "VM.Config.Options", "VM.Audit", "VM.Config.Disk",
                  "VM.Config.Network", "VM.Config.Memory", "VM.Config.CPU", "Datastore.AllocateSpace",
                  "Datastore.Audit", "SDN.Use", "VM.PowerMgmt")
    token = Connection(url=fakepve.url, node=NODE, method="token", token_id="gpunode", token_secret="tok-secret",
                       ca_file=fakepve_cafile)
    with pytest.raises(PveError, match="HTTP 403.*device passthrough is only allowed for root@pam"):
        PveClient(token).call("POST", f"nodes/{NODE}/lxc", vmid=201, ostemplate=desired()["ostemplate"],
                              rootfs="local-lvm:8", dev0="/dev/nvidia0,mode=0666")


def test_tls_refused_without_ca_or_pin(fakepve: Any, fakepve_cafile: str) -> None:
    plain = Connection(url=fakepve.url, node=NODE, password="secret", retries=0)
    with pytest.raises(PveError, match="TLS verification failed|CERTIFICATE_VERIFY_FAILED"):
        PveClient(plain).get("version")
    der = ssl.PEM_cert_to_DER_cert(Path(fakepve_cafile).read_text())
    digest = hashlib.sha256(der).hexdigest().upper()
    pin = ":".join(digest[i:i + 2] for i in range(0, 64, 2))
    pinned = Connection(url=fakepve.url, node=NODE, password="secret", fingerprint=pin)
    assert "version" in PveClient(pinned).get("version")
    wrong = Connection(url=fakepve.url, node=NODE, password="secret", retries=0,
                       fingerprint=":".join(["AB"] * 32))
    with pytest.raises(PveError, match="(?i)fingerprint|TLS"):
        PveClient(wrong).get("version")
    insecure = Connection(url=fakepve.url, node=NODE, password="secret", verify=False)
    assert "version" in PveClient(insecure).get("version")


def test_wrong_password_is_one_clear_error(fakepve: Any, fakepve_cafile: str) -> None:
    bad = Connection(url=fakepve.url, node=NODE, password="nope", ca_file=fakepve_cafile)
    with pytest.raises(PveError, match="login to .* as root@pam refused") as caught:
        PveClient(bad).get("version")
    assert "nope" not in str(caught.value)


def test_wanted_devices_follow_the_host() -> None:
    eight = [f"/dev/nvidia{i}" for i in range(8)] + CONTROL
    entries = lxc.wanted_devices(eight, "all", False, tuple(CONTROL), ("/dev/nvidia-modeset",))
    assert len(entries) == 11 and entries["/dev/nvidia7"] == "/dev/nvidia7,mode=0666"
    assert "/dev/nvidia-modeset" not in entries
    assert list(lxc.place_devices({}, entries))[:1] == ["dev0"] and lxc.place_devices({}, entries)["dev7"] == entries["/dev/nvidia7"]
    assert list(lxc.wanted_devices(eight + ["/dev/nvidia10"], [10, 2], False, tuple(CONTROL), ())) [:2] == [
        "/dev/nvidia10", "/dev/nvidia2"]
    with pytest.raises(ValueError, match="/dev/nvidia9 not on the host.*gpunode provision --tags host"):
        lxc.wanted_devices(eight, [9], False, tuple(CONTROL), ())
    with pytest.raises(ValueError, match="nvidia-uvm.*missing on the host.*nvidia-modprobe"):
        lxc.wanted_devices(GPUS + ["/dev/nvidiactl"], "all", False, tuple(CONTROL), ())
    mig = lxc.wanted_devices(GPUS + CONTROL + ["/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap1"],
                             "all", True, tuple(CONTROL), ())
    assert list(mig.values())[-2:] == ["/dev/nvidia-caps/nvidia-cap1,mode=0666", "/dev/nvidia-caps/nvidia-cap2,mode=0666"]


@pytest.mark.fakepve(time_scale=1)
def test_task_wait_has_a_timeout(fakepve: Any, fakepve_cafile: str) -> None:
    fakepve.ct_secs["create"] = 30
    slow = Connection(url=fakepve.url, node=NODE, password="secret", ca_file=fakepve_cafile, task_timeout_s=0.5)
    with pytest.raises(PveError, match=r"did not finish within 0\.5 s; it may still be running"):
        ensure(PveClient(slow), NODE, desired())


# -- ownership: what gpunode did not make it does not change, and never destroys ---------------
FOREIGN = {"hostname": "prod-db", "memory": 8192, "cores": 8, "swap": 512, "onboot": 0,
           "net0": "name=eth0,bridge=vmbr1,ip=dhcp", "rootfs": "local-lvm:vm-200-disk-0,size=8G",
           "description": "Production database\nowner: the DBA team"}


def foreign_ct(fakepve: Any, unprivileged: int = 0, status: str = "running") -> dict[str, Any]:
    """Someone else's container at vmid 200: no gpunode tag, its own name, memory and network."""
    fakepve.add_ct(200, "prod-db", node=NODE, status=status, config={**FOREIGN, "unprivileged": unprivileged})
    return dict(fakepve.ct(200).config)


def test_created_container_carries_the_mark(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    config = fakepve.ct(200).config
    assert lxc.owned(config) and config["description"].startswith("gpunode: made for host pve1")


def test_foreign_container_is_refused_before_any_write(fakepve: Any, conn: Connection) -> None:
    before = foreign_ct(fakepve)
    c = client(conn)
    with pytest.raises(lxc.NotOwned) as caught:
        ensure(c, NODE, desired())
    message = str(caught.value)
    assert "\n" not in message
    for part in ("container 200", "hostname prod-db", "running", "'Production database'", "no 'gpunode' tag",
                 "nothing was changed", "fix container.vmid", "--adopt"):
        assert part in message, part
    assert c.writes == 0 and not server_writes(fakepve)
    assert fakepve.ct(200).config == before and fakepve.ct(200).status == "running"


def test_recreate_never_destroys_a_foreign_container(fakepve: Any, conn: Connection) -> None:
    before = foreign_ct(fakepve, unprivileged=1)
    for adopt in (False, True):
        c = client(conn)
        with pytest.raises(lxc.NotOwned, match="never destroys|--adopt"):
            ensure(c, NODE, desired(), allow_recreate=True, adopt=adopt)
        assert c.writes == 0
    assert fakepve.ct(200).config == before and fakepve.ct(200).status == "running"


def test_adopt_in_check_mode_writes_nothing(fakepve: Any, conn: Connection) -> None:
    before = foreign_ct(fakepve)
    c = client(conn)
    result = ensure(c, NODE, desired(), check_mode=True, adopt=True)
    assert result.adopted and result.changed and "would adopt container 200" in result.actions[0]
    assert {"hostname", "memory", "tags", "description", "dev0"} <= {ch.key for ch in result.changes}
    assert c.writes == 0 and fakepve.ct(200).config == before


def test_adopt_converges_marks_and_keeps_the_operators_notes(fakepve: Any, conn: Connection) -> None:
    foreign_ct(fakepve)
    result = ensure(client(conn), NODE, desired(), adopt=True)
    assert result.adopted and result.changed
    config = fakepve.ct(200).config
    assert lxc.owned(config) and config["hostname"] == "glm5" and int(config["memory"]) == 4096
    lines = config["description"].splitlines()
    assert lines[0] == lxc.mark_line("pve1") and "Production database" in lines and "owner: the DBA team" in lines
    again = client(conn)
    second = ensure(again, NODE, desired())  # no --adopt needed any more
    assert not second.changed and not second.adopted and again.writes == 0


def test_adopt_marks_even_when_a_recreate_is_still_needed(fakepve: Any, conn: Connection) -> None:
    foreign_ct(fakepve, unprivileged=1)
    with pytest.raises(PveError, match="re-creating.*adopted now"):
        ensure(client(conn), NODE, desired(), adopt=True)
    assert lxc.owned(fakepve.ct(200).config) and int(fakepve.ct(200).config["unprivileged"]) == 1
    recreated = ensure(client(conn), NODE, desired(), allow_recreate=True)  # a later run, now gpunode's
    assert recreated.created and int(fakepve.ct(200).config.get("unprivileged", 0)) == 0


def test_operators_own_tags_and_lines_are_left_alone(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    fakepve.ct(200).config["tags"] = "gpu;gpunode;prod"
    fakepve.ct(200).config["description"] = lxc.mark_line("pve1") + "\nmaintenance window: Sundays"
    c = client(conn)
    assert not ensure(c, NODE, desired()).changed and c.writes == 0


def test_refused_connection_is_unreachable(fakepve_cafile: str) -> None:
    """Not retried as a whole (how fast: benchmarks/bad_input.py)."""
    from gpunode.stages.container.client import PveUnreachable

    with closed_port() as port:  # held by this test, never listening: every connection is refused
        client = PveClient(Connection(url=f"https://127.0.0.1:{port}", node=NODE, password="x",
                                      ca_file=fakepve_cafile), sleep=lambda _: None)
        with pytest.raises(PveUnreachable, match=f"Proxmox API https://127.0.0.1:{port} unreachable"):
            ensure(client, NODE, desired())
    # One login try plus the client's unreachable retries; ensure() did not start over.
    assert client.counts["POST"] == 1 + client.conn.unreachable_retries


def test_dropped_write_is_decided_again_not_called_unreachable(fakepve: Any, conn: Connection) -> None:
    """A connection dropped on a write (the API answered moments before) is not 'unreachable':
    ensure() reads state again and carries on."""
    import requests

    c = client(conn)
    real_once = c._once
    dropped: list[str] = []

    def once(method: str, path: str, params: dict[str, Any]) -> Any:
        if method == "POST" and path == f"nodes/{NODE}/lxc" and not dropped:
            dropped.append(path)
            raise requests.ConnectionError("Connection aborted.")
        return real_once(method, path, params)

    c._once = once  # type: ignore[method-assign]
    result = ensure(c, NODE, desired())
    assert dropped and result.created and fakepve.ct(200).status == "running"
    assert any(action.startswith("retrying after: POST nodes/pve1/lxc") for action in result.actions)


TREE_V1 = "/var/lib/gpunode/nvidia/580.159.04"
TREE_V2 = "/var/lib/gpunode/nvidia/580.172.08"


def driver(tree: str) -> dict[str, str]:
    return lxc.driver_mount(tree)


def test_driver_mount_is_hot_plugged_then_left_alone(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired())
    added = ensure(client(conn), NODE, desired(), mounts=driver(TREE_V1))
    # pve-container hot-plugs a new mount point into a running container: no restart needed.
    assert added.changed and not added.restart_needed and not added.pending
    assert props(fakepve.ct(200).config["mp0"]) == {"_": TREE_V1, "mp": "/usr/local/nvidia", "ro": "1"}
    again = client(conn)
    assert not ensure(again, NODE, desired(), mounts=driver(TREE_V1)).changed and again.writes == 0
    assert lxc.mounted_sources(client(conn), NODE, "/var/lib/gpunode/nvidia") == [TREE_V1]


def props(value: str) -> dict[str, str]:
    return lxc.props(value)


def test_new_driver_tree_waits_for_a_restart_and_both_trees_stay_in_use(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, desired(), mounts=driver(TREE_V1))
    checked = ensure(client(conn), NODE, desired(), mounts=driver(TREE_V2), check_mode=True)
    assert checked.changed and checked.pending == ["mp0"]
    moved = ensure(client(conn), NODE, desired(), mounts=driver(TREE_V2))
    assert moved.restart_needed and moved.pending == ["mp0"]
    assert "mount point" in moved.warnings[0] and "--restart-container" in moved.warnings[0]
    # Until the restart the container still mounts the old tree: neither may be removed.
    assert lxc.mounted_sources(client(conn), NODE, "/var/lib/gpunode/nvidia") == [TREE_V1, TREE_V2]
    restarted = ensure(client(conn), NODE, desired(), mounts=driver(TREE_V2), allow_restart=True)
    assert restarted.restarted and not restarted.pending
    assert lxc.mounted_sources(client(conn), NODE, "/var/lib/gpunode/nvidia") == [TREE_V2]


def test_operators_mount_points_keep_their_keys(fakepve: Any, conn: Connection) -> None:
    ensure(client(conn), NODE, {**desired(), "mp0": "/srv/datasets,mp=/data"})
    ensure(client(conn), NODE, {**desired(), "mp0": "/srv/datasets,mp=/data"}, mounts=driver(TREE_V1))
    config = fakepve.ct(200).config
    assert props(config["mp0"])["mp"] == "/data" and props(config["mp1"])["_"] == TREE_V1
    assert lxc.place_mounts(config, driver(TREE_V2)) == {"mp1": lxc.bind_mount(TREE_V2, "/usr/local/nvidia")}


def test_token_is_refused_for_a_bind_mount(fakepve: Any, fakepve_cafile: str) -> None:
    token = Connection(url=fakepve.url, node=NODE, method="token", token_id="root@pam!ci", token_secret="x",
                       ca_file=fakepve_cafile)
    plain = {k: v for k, v in desired().items() if not lxc.DEV_KEY.match(k)}
    with pytest.raises(PveError, match="bind mount points"):
        ensure(PveClient(token, sleep=lambda _: None), NODE, plain, mounts=driver(TREE_V1))
    assert not server_writes(fakepve)
