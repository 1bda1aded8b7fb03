"""The nvidia_device_facts module on real char nodes made with mknod (needs root, as CI is)."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import pytest
from gpunode.ground.paths import MODULE_UTILS

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("nvidia_nodes", MODULE_UTILS / "nvidia_nodes.py")
assert spec and spec.loader
facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(facts)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char devices needs root (CI runs as root)")


def _mknod(path: Path, major: int, minor: int) -> None:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, 0o666)  # mknod's mode passes through the umask


@needs_root
def test_scan_finds_gpus_controls_and_caps(tmp_path: Path) -> None:
    for minor in (0, 1, 10):
        _mknod(tmp_path / f"nvidia{minor}", 195, minor)
    _mknod(tmp_path / "nvidiactl", 195, 255)
    _mknod(tmp_path / "nvidia-uvm", 511, 0)
    (tmp_path / "nvidia-caps").mkdir()
    _mknod(tmp_path / "nvidia-caps" / "nvidia-cap1", 508, 1)
    (tmp_path / "nvidia-foo").write_text("not a device")
    (tmp_path / "null").touch()
    found = facts.scan(str(tmp_path), try_open=True)
    assert found["gpus"] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia10"]  # by minor, not by text
    assert found["caps"] == ["/dev/nvidia-caps/nvidia-cap1"]
    assert set(found["devices"]) == {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia10", "/dev/nvidiactl",
                                     "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"}
    ctl = found["devices"]["/dev/nvidiactl"]
    assert (ctl["char"], ctl["major"], ctl["minor"], ctl["mode"]) == (True, 195, 255, "0o666")
    # No driver behind these numbers on this machine: ENXIO or ENODEV, never success.
    assert ctl["open_error"] in ("ENXIO", "ENODEV")


def test_regular_file_is_not_a_char_device(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").write_text("")
    found = facts.scan(str(tmp_path), try_open=True)
    assert found["devices"]["/dev/nvidia0"]["char"] is False
    assert found["devices"]["/dev/nvidia0"]["open_error"] is None


def test_proc_devices_parsing(tmp_path: Path) -> None:
    sample = tmp_path / "devices"
    sample.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n509 nvidia-caps\n\n"
                      "Block devices:\n  8 sd\n259 nvidia-not-char\n")
    assert facts.proc_devices(str(sample)) == {"nvidia-frontend": 195, "nvidia-uvm": 508, "nvidia-caps": 509}
    assert facts.proc_devices(str(tmp_path / "missing")) == {}
