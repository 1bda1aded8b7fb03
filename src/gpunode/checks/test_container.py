"""Layer container: the Proxmox config equals the host file (every devN), and it runs.

Read through the API from where gpunode runs (nothing is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpunode import handoff
from gpunode.pve import lxc
from gpunode.pve.client import Connection, PveClient


@pytest.fixture
def api(pve_host: Any, hostvars: dict[str, Any]) -> PveClient:
    def secret(kind: str) -> str | None:
        path = hostvars.get(f"gpunode_api_{kind}_file")
        return Path(path).read_text().strip() if path else None

    return PveClient(Connection(
        url=hostvars["gpunode_api_url"], node=hostvars["gpunode_api_node"], method=hostvars["gpunode_api_auth_method"],
        user=hostvars["gpunode_api_user"], password=secret("password"), token_id=hostvars.get("gpunode_api_token_id"),
        token_secret=secret("token_secret"), verify=hostvars["gpunode_api_tls_verify"],
        ca_file=hostvars.get("gpunode_api_tls_ca_file"), fingerprint=hostvars.get("gpunode_api_tls_fingerprint")))


@pytest.fixture
def desired(pve_host: Any, hostvars: dict[str, Any], host_facts: dict[str, Any]) -> dict[str, Any]:
    devices = lxc.device_entries(list(host_facts["devices"]["devices"]), hostvars["gpunode_container_gpus"],
                                 hostvars["gpunode_container_mig"], ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                                     "/dev/nvidia-uvm-tools"], ["/dev/nvidia-modeset"])
    return {**hostvars["gpunode_container"], **devices}


def _converger(api: PveClient, hostvars: dict[str, Any]) -> lxc.Converger:
    return lxc.Converger(api, hostvars["gpunode_api_node"], int(hostvars["gpunode_container"]["vmid"]))


def test_container_exists(pve_host: Any, api: PveClient, hostvars: dict[str, Any]) -> None:
    vmid = hostvars["gpunode_container"]["vmid"]
    assert _converger(api, hostvars).exists(), f"container {vmid} does not exist: run `gpunode provision --tags container`"


def test_container_running(pve_host: Any, api: PveClient, hostvars: dict[str, Any]) -> None:
    ct = _converger(api, hostvars)
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    status = ct.status().get("status")
    assert status == "running", f"container {ct.vmid} is {status}: run `gpunode provision --tags container`"


def test_container_is_gpunodes(pve_host: Any, api: PveClient, hostvars: dict[str, Any]) -> None:
    ct = _converger(api, hostvars)
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    config = ct.config()
    assert lxc.owned(config), lxc.foreign_message(ct.vmid, config, ct.status(), refused=False)


def _group(key: str) -> str:
    return "devices" if lxc.DEV_KEY.match(key) else "driver mount" if lxc.MP_KEY.match(key) else "settings"


@pytest.mark.parametrize("group", ["devices", "driver mount", "settings"])
def test_container_config_matches(group: str, pve_host: Any, api: PveClient, hostvars: dict[str, Any],
                                  desired: dict[str, Any], host_facts: dict[str, Any]) -> None:
    ct = _converger(api, hostvars)
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    live = ct.config()
    if group == "driver mount":
        if not hostvars.get("gpunode_driver_mount"):
            pytest.skip("nvidia-runtime hand-off: no driver mount point")
        version = host_facts["driver"]["version"]
        if not version:
            pytest.fail("no NVIDIA module loaded on the host: there is no driver tree to mount")
        desired = {**desired, **lxc.place_mounts(live, lxc.driver_mount(f"{handoff.TREE_ROOT}/{version}"))}
    changes = [c for c in lxc.compare(live, desired) if _group(c.key) == group]
    assert not changes, "differs from the host file: " + "; ".join(
        f"{c.key}: live {c.before!r}, want {c.after!r}" for c in changes) + \
        " -> run `gpunode provision --tags container` (devN changes need --restart-container)"


def test_no_pending_changes(pve_host: Any, api: PveClient, hostvars: dict[str, Any]) -> None:
    ct = _converger(api, hostvars)
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    pending = ct.pending()
    assert not pending, f"changes waiting for a restart: {', '.join(pending)} -> `gpunode provision --restart-container`"
