"""The lab's Proxmox (gpunode_lab.pve's LabPve over fakepve) served in this process, with a Proxmox
host whose /dev is a folder of real device nodes made here, and no LXC container to realize
(issue #32):

- it refuses what Proxmox refuses, with Proxmox's status and text, and gpunode sends each such
  request once;
- per version, what the container stage predicts in check mode is what the lab's Proxmox then
  does: PVE 9 hot-plugs a new devN, PVE 8 keeps it for the next start; both keep a changed or
  removed one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakepve.pytest_plugin import _Serving  # type: ignore[import-untyped]  # fakepve's own in-thread server

from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection, PveClient, PveError
from gpunode_lab.pve import LabPve, Realizer

NODE = "pve1"
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
HOST = [f"/dev/nvidia{i}" for i in range(8)] + list(CONTROL)
TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"


def host_root(tmp_path: Path) -> Path:
    """A Proxmox host's / with the NVIDIA nodes of HOST under dev/ (char 195:N, and the uvm pair)."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    for index, path in enumerate(HOST):
        os.mknod(root / path.lstrip("/"), stat.S_IFCHR | 0o666, os.makedev(195 if "uvm" not in path else 511, index))
    return root


@pytest.fixture(params=["9.0.10", "8.4.1"])
def labpve(request: pytest.FixtureRequest, tmp_path: Path, _fakepve_pki: tuple[str, str]) -> Iterator[Any]:
    (tmp_path / "lxc").mkdir()
    realizer = Realizer(tmp_path / "lxc", host_root(tmp_path), tmp_path / "state" / "mounts.json")
    pve = LabPve(user="root@pam", password="secret", host="127.0.0.1", port=0, realizer=realizer,
                 pve_version=request.param)
    pve.time_scale = 0
    serving = _Serving(pve, *_fakepve_pki)
    try:
        yield pve
    finally:
        serving.stop()


@pytest.fixture
def client(labpve: Any, fakepve_cafile: str) -> PveClient:
    return PveClient(Connection(url=labpve.url, node=NODE, password="secret", ca_file=fakepve_cafile, backoff_s=0.01,
                                task_timeout_s=10), sleep=lambda _: None)


def config() -> dict[str, Any]:
    return {"vmid": 200, "hostname": "glm5", "ostemplate": TEMPLATE, "rootfs": "local-lvm:8", "memory": 4096,
            "features": "nesting=1,keyctl=1", "unprivileged": 0, "tags": lxc.OWNER_TAG,
            "description": lxc.mark_line("pve1")}


def converge(client: PveClient, gpus: list[int], **options: Any) -> lxc.Result:
    devices = lxc.wanted_devices(HOST, gpus, False, CONTROL, ())
    return lxc.ensure(client, NODE, config(), devices=devices, host_nodes=HOST, **options)


@pytest.mark.parametrize(("params", "status", "text"), [
    ({"dev0": "/dev/../etc/shadow"}, 400, "dev0.path: invalid format - /dev/../etc/shadow is not a valid device path"),
    ({"dev0": "nvidia0,mode=0666"}, 400, "dev0.path: invalid format - nvidia0 is not a valid device path"),
    ({"mp0": "/srv,mp=/mnt/../etc"}, 400, "mp0.mp: invalid format - /mnt/../etc contains illegal character sequences"),
    ({"onboot": "True"}, 400, "onboot: type check ('boolean') failed - got 'True'"),
    ({"dev0": "/dev/nvidia9,mode=0666"}, 500, "Device /dev/nvidia9 does not exist"),
    ({"dev0": "/dev/null-ish"}, 500, "Device /dev/null-ish does not exist"),
    ({"ssh-public-keys": "# a comment line\n"}, 500, "SSH public key validation error"),
])
def test_refused_as_proxmox_refuses_once_and_nothing_made(labpve: Any, client: PveClient, params: dict[str, str],
                                                          status: int, text: str) -> None:
    with pytest.raises(PveError) as caught:
        client.call("POST", f"nodes/{NODE}/lxc", vmid=201, ostemplate=TEMPLATE, rootfs="local-lvm:8", **params)
    assert caught.value.status == status and text in str(caught.value)
    assert not caught.value.retryable and client.counts["POST"] == 2  # the login and this one: never retried
    assert labpve.ct(201) is None


def test_a_devn_for_a_node_the_host_lacks_fails_an_update(labpve: Any, client: PveClient) -> None:
    converge(client, [0, 1])
    with pytest.raises(PveError) as caught:
        client.call("PUT", f"nodes/{NODE}/lxc/200/config", dev9="/dev/nvidia9,mode=0666")
    assert caught.value.status == 500 and "Device /dev/nvidia9 does not exist" in str(caught.value)
    assert "dev9" not in labpve.ct(200).config and "dev9" not in labpve.ct(200).pending


def test_check_mode_predicts_what_the_lab_proxmox_does(labpve: Any, client: PveClient) -> None:
    """2 -> 8 GPUs on a running container (only new keys), then 8 -> 4 (deletes): check mode's
    ``applies`` equals what the version's Proxmox then did, read back from its pending changes."""
    converge(client, [0, 1])
    ct = labpve.ct(200)
    assert ct.status == "running"
    pve9 = labpve.version.startswith("9.")
    for gpus in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3]):
        predicted = converge(client, gpus, check_mode=True)
        done = converge(client, gpus)
        assert predicted.applies == done.applies and predicted.applies
        assert sorted(predicted.pending) == sorted(done.pending) == sorted(
            key for key, how in done.applies.items() if how == "restart")
        if len(gpus) == 8:  # new keys: live on PVE 9 only
            assert set(done.applies.values()) == {"live" if pve9 else "restart"}
        else:  # removed keys wait on both
            assert set(done.applies.values()) == {"restart"}
        assert not done.restarted and ct.status == "running"
        converge(client, gpus, allow_restart=True)  # settle before the next step
        assert ct.pending == {}


def test_a_gpu_removed_and_given_back_before_the_restart_keeps_its_key(labpve: Any, client: PveClient) -> None:
    """4 -> 2 leaves two deletes pending; back to 4 takes the same keys again, which cancels the
    deletes (a new key for the same node would have Proxmox make a second node of one path)."""
    converge(client, [0, 1, 2, 3])
    ct = labpve.ct(200)
    keys = {key: value for key, value in ct.config.items() if lxc.DEV_KEY.match(key)}
    two = converge(client, [0, 1])
    assert sorted(two.pending) == ["dev2", "dev3"]
    predicted = converge(client, [0, 1, 2, 3], check_mode=True)
    back = converge(client, [0, 1, 2, 3])
    assert predicted.applies == back.applies == {"dev2": "live", "dev3": "live"}
    assert predicted.pending == [] and not predicted.restart_needed
    assert back.pending == [] and ct.pending == {} and not back.restarted
    assert {key: value for key, value in ct.config.items() if lxc.DEV_KEY.match(key)} == keys
