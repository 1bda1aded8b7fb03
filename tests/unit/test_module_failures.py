"""Every custom module fails with a message through fail_json, never a traceback: run for real
through `ansible localhost -m MODULE` with the project's library, as a playbook would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpunode.ground.paths import ANSIBLE_CFG

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import closed_port  # noqa: E402 - tests/ put on the path just above

ROOT = Path(__file__).resolve().parents[2]


def run_module(name: str, args: dict, tmp_path: Path) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal", "ANSIBLE_LOCAL_TEMP": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", f"gpunode.core.{name}", "-a", json.dumps(args)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    # minimal callback: "localhost | FAILED! => {...}" (or SUCCESS)
    head, _, body = result.stdout.partition(" => ")
    return {**json.loads(body), "failed": "FAILED" in head}


LXC_ARGS = {"node": "pve1", "password": "not-the-real-password", "config": {"vmid": 200, "hostname": "glm5"},
            "devices": ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"],
            "control_nodes": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]}


def test_stage_module_names_what_is_wrong_with_its_host_data(tmp_path: Path) -> None:
    from gpunode import hostfile, inventory

    lab = hostfile.load(ROOT / "inventory/lab/host.yml")
    data = inventory.host_vars(lab, lab.hosts[0], {})
    data["gpunode_host"]["container"]["vmid"] = 5
    res = run_module("gpunode_stage", {"stage": "serve", "host": data["gpunode_host"],
                                       "derived": data["gpunode_derived"]}, tmp_path)
    assert res["failed"] and res["msg"] == ("serve: the host data is not what this gpunode writes (Host): "
                                            "container.vmid: Input should be greater than or equal to 100")


def test_stage_action_refuses_an_unknown_option_and_writes_no_record_for_a_stage_that_never_ran(tmp_path: Path) -> None:
    """gpunode_stage is an action (it runs in Ansible's own process): its options are checked as a
    module's are, and a record is written only from what a stage returned."""
    from gpunode import hostfile, inventory

    lab = hostfile.load(ROOT / "inventory/lab/host.yml")
    data = inventory.host_vars(lab, lab.hosts[0], {})
    res = run_module("gpunode_stage", {"stage": "serve", "host": data["gpunode_host"], "derived": data["gpunode_derived"],
                                       "recrod": "/tmp/x"}, tmp_path)
    assert res["failed"] and "recrod" in res["msg"] and "Unsupported parameters" in res["msg"], res["msg"]
    data["gpunode_host"]["container"]["vmid"] = 5
    record = tmp_path / "serve.json"
    res = run_module("gpunode_stage", {"stage": "serve", "host": data["gpunode_host"], "derived": data["gpunode_derived"],
                                       "record": str(record)}, tmp_path)
    assert res["failed"] and res["msg"].startswith("serve: the host data is not what this gpunode writes"), res["msg"]
    assert not record.exists()


def test_lxc_module_names_an_unreadable_keys_file(tmp_path: Path) -> None:
    with closed_port() as port:  # nothing answers there, should the module call the API at all
        res = run_module("pve_lxc_gpu", {**LXC_ARGS, "api_url": f"https://127.0.0.1:{port}",
                                         "ssh_public_keys_file": str(tmp_path / "missing.pub")}, tmp_path)
    assert res["failed"] and res["msg"] == (f"container.ssh_public_keys: cannot read {tmp_path / 'missing.pub'}: "
                                            "No such file or directory; nothing was changed")


def test_lxc_module_names_a_node_that_is_not_a_character_device(tmp_path: Path) -> None:
    facts = {path: {"char": True} for path in LXC_ARGS["devices"]}
    facts["/dev/nvidia0"] = {"char": False}  # nvidia_device_facts' map: a plain file at that path
    with closed_port() as port:  # nothing answers there: the module must stop before any request
        res = run_module("pve_lxc_gpu", {**LXC_ARGS, "api_url": f"https://127.0.0.1:{port}", "devices": facts,
                                         "gpus": [0]}, tmp_path)
    assert res["failed"] and not res.get("gpunode_unreachable")
    assert res["msg"].startswith("GPU device nodes: selected GPU node(s) /dev/nvidia0 (there, but not a character "
                                 "device) not on the host")
    assert res["msg"].endswith("nothing was changed")


def test_lxc_module_says_unreachable(tmp_path: Path) -> None:
    with closed_port() as port:
        res = run_module("pve_lxc_gpu", {**LXC_ARGS, "api_url": f"https://127.0.0.1:{port}"}, tmp_path)
    assert res["failed"] and res["gpunode_unreachable"] is True
    assert res["msg"].startswith(f"Proxmox API https://127.0.0.1:{port} unreachable: ConnectionError")


@pytest.mark.parametrize("name, args", [
    ("nvidia_host_facts", {"facts_root": "/nonexistent", "dev_root": "/nonexistent"}),
    ("nvidia_device_facts", {"dev_root": "/nonexistent"}),
    ("gpu_host_findings", {"facts": {"bogus": 1}, "driver_version": "580.95.05"}),
])
def test_fact_modules_never_traceback(tmp_path: Path, name: str, args: dict) -> None:
    """Read-only modules on inputs that make no sense: an answer or a message, not a crash."""
    res = run_module(name, args, tmp_path)
    assert "module_stderr" not in res and "exception" not in res and (not res["failed"] or res["msg"])
