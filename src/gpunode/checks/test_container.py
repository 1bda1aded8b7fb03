"""Layer container: the Proxmox config equals the host file (every devN), and it runs.

Read through the API from where gpunode runs (nothing is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.container import lxc
from gpunode.stages.container.client import Connection, PveClient
from gpunode.ground.nvidia import TREE_ROOT


@pytest.fixture
def api(pve_host: Any, gpunode_host: dict[str, Any], gpunode_secrets: dict[str, Any]) -> PveClient:
    def secret(kind: str) -> str | None:
        path = gpunode_secrets.get(f"{kind}_file")
        return Path(path).read_text().strip() if path else None

    api, auth, tls = gpunode_host["api"], gpunode_host["api"]["auth"], gpunode_host["api"]["tls"]
    return PveClient(Connection(
        url=api["url"], node=api["node"], method=auth["method"], user=auth["user"], password=secret("password"),
        token_id=auth.get("token_id"), token_secret=secret("token_secret"), verify=tls["verify"],
        ca_file=tls.get("ca_file"), fingerprint=tls.get("fingerprint")))


@pytest.fixture
def devices(pve_host: Any, gpunode_host: dict[str, Any], host_facts: dict[str, Any]) -> dict[str, str]:
    """The devN values by host path the container stage wants (keys are placed against the live config)."""
    found, not_char = lxc.char_nodes(host_facts["devices"]["devices"])
    return lxc.wanted_devices(found, gpunode_host["container"]["gpus"], gpunode_host["container"]["mig"],
                              not_char=not_char)


@pytest.fixture
def ct(api: PveClient, gpunode_host: dict[str, Any]) -> lxc.Converger:
    return lxc.Converger(api, gpunode_host["api"]["node"], int(gpunode_host["container"]["vmid"]))


def test_container_exists(pve_host: Any, ct: lxc.Converger) -> None:
    assert ct.exists(), f"container {ct.vmid} does not exist: run `gpunode provision --tags container`"


def test_container_running(pve_host: Any, ct: lxc.Converger) -> None:
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    status = ct.status().get("status")
    assert status == "running", f"container {ct.vmid} is {status}: run `gpunode provision --tags container`"


def test_container_is_gpunodes(pve_host: Any, ct: lxc.Converger) -> None:
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    config = ct.config()
    assert lxc.owned(config), lxc.foreign_message(ct.vmid, config, ct.status(), refused=False)


def _group(change: lxc.Change) -> str:
    if lxc.DEV_KEY.match(change.key):
        return "devices"
    if lxc.MP_KEY.match(change.key):
        target = lxc.props(str(change.after or change.before or "")).get("mp")
        return "driver mount" if target == lxc.MOUNT_POINT else "model mount"
    return "settings"


@pytest.mark.parametrize("group", ["devices", "driver mount", "model mount", "settings"])
def test_container_config_matches(group: str, pve_host: Any, ct: lxc.Converger, gpunode_derived: dict[str, Any],
                                  devices: dict[str, str], host_facts: dict[str, Any]) -> None:
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    live = ct.config()
    # Each device path keeps the devN key it has, as the container stage places them.
    desired = {**gpunode_derived["container_config"], **lxc.place_devices(live, devices)}
    if group == "driver mount":
        if not gpunode_derived["driver_mount"]:
            pytest.skip("nvidia-runtime hand-off: no driver mount point")
        version = host_facts["driver"]["version"]
        if not version:
            pytest.fail("no NVIDIA module loaded on the host: there is no driver tree to mount")
        desired = {**desired, **lxc.place_mounts(live, lxc.driver_mount(f"{TREE_ROOT}/{version}"))}
    if group == "model mount":
        model = gpunode_derived["model"]
        if not model["mount_source"]:
            pytest.skip("the weights are inside the container (model.source: node_path): no mount point")
        desired = {**desired, **lxc.place_mounts(live, lxc.model_mount(model["mount_source"], model["mount_target"]))}
    changes = [c for c in lxc.compare(live, desired) if _group(c) == group]
    assert not changes, "differs from the host file: " + "; ".join(
        f"{c.key}: live {c.before!r}, want {c.after!r}" for c in changes) + \
        " -> run `gpunode provision --tags container` (a changed or removed devN waits for --restart-container)"


def test_no_pending_changes(pve_host: Any, ct: lxc.Converger) -> None:
    if not ct.exists():
        pytest.fail("container missing: run `gpunode provision --tags container`")
    pending = ct.pending()
    assert not pending, f"changes waiting for a restart: {', '.join(pending)} -> `gpunode provision --restart-container`"
