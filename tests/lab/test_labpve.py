"""gpunode_lab.pve for real: bind mount points set through the lab's fakepve appear in the lab's
LXC container `gpunode-lab` the way pve-container realizes them.

A fakepve container of its own (VMID, hostname gpunode-lab, which is what ties it to the LXC
container) carries the mount points; the source directories are made on the PVE host stand-in
(gpunode-lab-host's rootfs) and removed again, with the container, whatever happens. Restarting
through the API never restarts the LXC container: the test checks that its init pid stays.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpunode_lab as lab
from gpunode_lab import pve as labpve
from gpunode.stages.container.client import Connection, PveClient, PveError
from gpunode.stages.container.lxc import Converger

pytestmark = pytest.mark.lab

VMID = 290  # the other lab tests use 200
TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"
SOURCES = "/var/lib/gpunode-test-mp"  # on the PVE host: gpunode-lab-host
TARGET = "/mnt/gpunode-test"  # in the GPU container: gpunode-lab


def api() -> PveClient:
    return PveClient(Connection(url=lab.PVE_URL, node=lab.PVE_NODE, password=lab.PVE_PASSWORD_FILE.read_text().strip(),
                                ca_file=str(lab.PVE_CA)))


def mp(version: str, ro: bool = True) -> str:
    return f"{SOURCES}/{version},mp={TARGET}" + (",ro=1" if ro else "")


def init_pid() -> int:
    out = subprocess.run(["lxc-info", "-P", str(lab.LXC_PATH), "-n", lab.CONTAINER_NAME, "-pH"], capture_output=True,
                         text=True, check=True).stdout.strip()
    return int(out)


def mount_options() -> list[str] | None:
    """Per-mount options of the topmost mount on TARGET in gpunode-lab, or None if nothing is mounted there."""
    found = None
    for line in Path(f"/proc/{init_pid()}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == TARGET:
            found = fields[5].split(",")
    return found


def in_lab(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["lxc-attach", "-P", str(lab.LXC_PATH), "-n", lab.CONTAINER_NAME, "--", *argv], check=False,
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def seen() -> str:
    """The marker file as the GPU container sees it, or '' when there is none."""
    out = in_lab("cat", f"{TARGET}/marker")
    return out.stdout.strip() if out.returncode == 0 else ""


def realized() -> list[dict[str, object]]:
    """What labpve's state file says it mounted for our container."""
    if not lab.PVE_MOUNTS.exists():
        return []
    return [m for m in json.loads(lab.PVE_MOUNTS.read_text())["mounts"] if m["vmid"] == VMID]


def _remove(ct: Converger) -> None:
    if ct.exists():
        if ct.status().get("status") == "running":
            ct.stop()
        ct.destroy()


@pytest.fixture
def ct() -> Iterator[Converger]:
    """Our fakepve container, running, with source directories v1 and v2 on the PVE host; all gone after."""
    pid = int(lab.PVE_PID_FILE.read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    if lab.PVE_MODULE not in cmdline:
        pytest.fail(f"the lab's fakepve is not {lab.PVE_MODULE} (made by an older gpunode): run `gpunode lab up`")
    conv = Converger(api(), lab.PVE_NODE, VMID)
    sources = lab.HOST_ROOTFS / SOURCES.lstrip("/")
    _remove(conv)  # an interrupted earlier run
    shutil.rmtree(sources, ignore_errors=True)
    for version in ("v1", "v2"):
        (sources / version).mkdir(parents=True)
        (sources / version / "marker").write_text(f"{version}\n")
    before = init_pid()
    try:
        conv.create({"vmid": VMID, "ostemplate": TEMPLATE, "hostname": lab.CONTAINER_HOSTNAME,
                     "rootfs": "local-lvm:8", "memory": 512, "start": 1})
        assert conv.status()["status"] == "running"
        yield conv
        assert init_pid() == before, "the LXC container was restarted"
    finally:
        _remove(conv)
        try:
            assert mount_options() is None, f"{TARGET} is still mounted after CT {VMID} was destroyed"
            assert realized() == []
        finally:
            if mount_options() is not None:  # leave no mount behind, even when labpve failed
                labpve._run_helper(["umount", str(init_pid()), TARGET])
            with contextlib.suppress(OSError):  # the mount point labpve made, as pve-container does
                (lab.ROOTFS / TARGET.lstrip("/")).rmdir()
            shutil.rmtree(sources, ignore_errors=True)


def test_hotplug_pending_and_restart(ct: Converger) -> None:
    client, base = ct.client, f"nodes/{lab.PVE_NODE}/lxc/{VMID}"

    # A new mount point on a running container is hot-plugged, before the request returns.
    client.call("PUT", f"{base}/config", mp0=mp("v1"))
    assert ct.pending() == [] and ct.config()["mp0"] == mp("v1")
    assert seen() == "v1"
    assert mount_options() is not None and "ro" in mount_options()  # type: ignore[operator]
    write = in_lab("touch", f"{TARGET}/new")
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    assert not (lab.HOST_ROOTFS / SOURCES.lstrip("/") / "v1" / "new").exists()
    assert [(m["container"], m["target"], m["volume"], m["ro"]) for m in realized()] == [
        (lab.CONTAINER_NAME, TARGET, f"{SOURCES}/v1", True)]

    # A changed one stays pending, and the old mount with it, until a restart through the API.
    client.call("PUT", f"{base}/config", mp0=mp("v2"))
    assert ct.pending() == ["mp0"] and ct.config()["mp0"] == mp("v2")  # /config shows pending values
    assert seen() == "v1"
    ct.stop()
    assert mount_options() is None and seen() == ""  # a stopped container has no mounts
    ct.start()
    assert ct.pending() == [] and seen() == "v2"

    # Unmounted by hand: the periodic pass mounts it again.
    labpve._run_helper(["umount", str(init_pid()), TARGET])
    assert seen() == ""
    deadline = time.monotonic() + 10
    while seen() != "v2" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert seen() == "v2"

    # A deleted one stays too, until the restart.
    client.call("PUT", f"{base}/config", delete="mp0")
    assert ct.pending() == ["mp0"] and seen() == "v2"
    ct.stop()
    ct.start()
    assert ct.pending() == [] and "mp0" not in ct.config()
    assert mount_options() is None and seen() == "" and realized() == []


def test_hotplug_of_missing_directory_fails_and_changes_nothing(ct: Converger) -> None:
    client, base = ct.client, f"nodes/{lab.PVE_NODE}/lxc/{VMID}"
    config = ct.config()
    with pytest.raises(PveError) as exc:
        client.call("PUT", f"{base}/config", mp0=mp("missing"), memory=1024)
    assert exc.value.status == 400
    assert f"mp0: unable to hotplug mp0: directory '{SOURCES}/missing' does not exist" in str(exc.value)
    # pve-container writes nothing of an update whose hot-plug failed.
    assert ct.config() == config and ct.pending() == []
    assert mount_options() is None and realized() == []

    # Writable when ro is not set; and once the directory is there, the same request works.
    client.call("PUT", f"{base}/config", mp0=mp("v1", ro=False))
    assert seen() == "v1" and "rw" in (mount_options() or [])
    assert in_lab("touch", f"{TARGET}/new").returncode == 0
    assert (lab.HOST_ROOTFS / SOURCES.lstrip("/") / "v1" / "new").exists()


def test_launcher_command_line() -> None:
    """lab.py finds the process by 'fakepve' (stop, status) and knows it runs labpve."""
    pid = int(lab.PVE_PID_FILE.read_text())
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert "fakepve" in " ".join(args)
    assert args[1:3] == ["-m", lab.PVE_MODULE]
    for flag, value in (("--lxcpath", lab.LXC_PATH), ("--host-rootfs", lab.HOST_ROOTFS), ("--state", lab.PVE_MOUNTS)):
        assert args[args.index(flag) + 1] == str(value)
