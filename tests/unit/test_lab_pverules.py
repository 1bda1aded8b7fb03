"""The lab's Proxmox refuses what pve-container and pve-common refuse (gpunode_lab.pverules, issue
#32): each rule against the cases its Perl source names, and the SSH key check (the real
ssh-keygen, as Proxmox runs it) against gpunode's own check of the same lines."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.hostfile import sshkeys
from gpunode_lab import pverules

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ssh_keys import KINDS, variants  # noqa: E402 - this folder put on the path just above


@pytest.mark.parametrize(("path", "refused"), [
    ("/dev/nvidia0", False), ("/dev/nvidia-caps/nvidia-cap1", False), ("/dev/dri/renderD128", False),
    ("nvidia0", True), ("/tmp/nvidia0", True), ("/dev/../etc/shadow", True), ("/dev/./nvidia0", True),
    ("/dev/nvidia0/..", True), ("/dev/nvidia0/.", True), ("/dev/..nvidia", False), ("/dev", True),
])
def test_device_paths_as_verify_lxc_dev_string(path: str, refused: bool) -> None:
    assert pverules.dev_path_problem(path) == (f"{path} is not a valid device path" if refused else None)


@pytest.mark.parametrize(("path", "refused"), [
    ("/usr/local/nvidia", False), ("relative/ok", False), ("/a/../b", True), ("/a/./b", True), ("/a/..", True),
    ("/a/.", True), ("../a", True), ("/a/..b", False), ("..a", False),
])
def test_mount_point_paths_as_verify_lxc_mp_string(path: str, refused: bool) -> None:
    expected = f"{path} contains illegal character sequences" if refused else None
    assert pverules.mp_path_problem(path) == expected


def test_top_level_booleans_are_0_or_1_and_json_booleans_only_in_json() -> None:
    parameters = {"properties": {"onboot": {"type": "boolean"}, "start": {"type": "boolean"},
                                 "hostname": {"type": "string"}}}
    assert pverules.boolean_problems(parameters, {"onboot": "1", "start": 0, "hostname": "True"}, False) == {}
    assert pverules.boolean_problems(parameters, {"onboot": "True", "start": "yes"}, False) == {
        "onboot": "type check ('boolean') failed - got 'True'", "start": "type check ('boolean') failed - got 'yes'"}
    assert pverules.boolean_problems(parameters, {"onboot": True}, False) == {
        "onboot": "type check ('boolean') failed - got 'True'"}
    assert pverules.boolean_problems(parameters, {"onboot": True}, True) == {}
    assert pverules.boolean_problems(None, {"onboot": "True"}, False) == {}


def test_device_nodes_as_get_device_mode_and_rdev(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    os.mknod(tmp_path / "dev" / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    (tmp_path / "dev" / "nvidia1").write_text("")
    (tmp_path / "dev" / "nvidia-caps").mkdir()
    assert pverules.device_problem(tmp_path, "/dev/nvidia0") is None
    assert pverules.device_problem(tmp_path, "/dev/nvidia7") == "Device /dev/nvidia7 does not exist\n"
    assert pverules.device_problem(tmp_path, "/dev/nvidia1") == "/dev/nvidia1 is not a device\n"
    assert pverules.device_problem(tmp_path, "/dev/nvidia-caps") == "/dev/nvidia-caps is not a device\n"
    assert pverules.device_problem(tmp_path, "/dev/nvidia1/x") == "Error accessing device /dev/nvidia1/x\n"


@pytest.fixture(scope="module")
def public_keys(key_pairs: dict[str, Path]) -> dict[str, str]:
    return {name: path.with_suffix(".pub").read_text().strip() for name, path in key_pairs.items()}


def test_the_lab_checks_keys_with_ssh_keygen_and_agrees_with_gpunode(public_keys: dict[str, str]) -> None:
    """Every line gpunode takes, the lab's Proxmox takes, and the other way round; a file with a
    blank line between keys is fine for both, a file with one bad line is refused whole."""
    for line in (case for key in public_keys.values() for case in variants(key).values()):
        assert (pverules.ssh_keys_problem(line) is None) == (sshkeys.line_problem(line) is None), line
    good = "\n".join(public_keys.values())
    assert pverules.ssh_keys_problem(f"{good}\n\n  \n") is None
    assert pverules.ssh_keys_problem(f"{good}\n# a comment\n") == "SSH public key validation error\n"
