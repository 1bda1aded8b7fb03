"""The host's driver tree, planned from the layout recorded on an H200 (record_driver.py) and
listed through the real ldconfig from the cache the real ldconfig made there."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpunode_lab import driver as labdriver
from gpunode_lab.contract import HOST_DRIVER_LAYOUT
from gpunode.ground.paths import MODULE_UTILS

ROOT = Path(__file__).resolve().parents[2]
RECORDED = HOST_DRIVER_LAYOUT  # the lab ships the recording (gpunode_lab/recorded)
TREE_PROBE = ROOT / "tests" / "fixtures" / "host" / "h200" / "driver" / "tree_probe.json"
LAYOUT = json.loads((RECORDED / "layout.json").read_text())
VERSION = LAYOUT["version"]

spec = importlib.util.spec_from_file_location("driver_tree", MODULE_UTILS / "driver_tree.py")
assert spec and spec.loader
driver_tree: Any = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver_tree)


def ldconfig_p(root: Path) -> str:
    return subprocess.run(["ldconfig", "-p", "-C", str(root / "etc" / "ld.so.cache")], capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    labdriver.lay_out(RECORDED, root)
    return root


def test_recorded_sonames_agree_with_readelf() -> None:
    files = [row for row in LAYOUT["libraries"] if row["type"] == "file"]
    assert len(files) == 26 and all(row["name"].endswith(f".so.{VERSION}") for row in files)
    assert all(row["soname"] == row["readelf_soname"] for row in files)


def test_plan_takes_every_library_under_its_soname(host: Path) -> None:
    plan = driver_tree.plan(driver_tree.parse_ldconfig(ldconfig_p(host)), VERSION, str(host))
    recorded = {row["soname"]: f"/usr/lib/x86_64-linux-gnu/{row['name']}" for row in LAYOUT["libraries"]
                if row["type"] == "file"}
    assert plan["libraries"] == dict(sorted(recorded.items()))
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4", "libnvidia-ptxjitcompiler.so.1",
                 "libnvidia-gpucomp.so.580.159.04"):
        assert name in plan["libraries"]
    assert sorted(plan["binaries"]) == sorted(row["name"] for row in LAYOUT["bin"])
    assert plan["binaries"]["nvidia-smi"] == "/usr/bin/nvidia-smi"


def test_plan_leaves_out_build_links_other_versions_and_32_bit(host: Path) -> None:
    labdriver.lay_out(RECORDED, host / "other", "580.172.08")  # another version's files, not in the cache
    extra = ("\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
             "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
             "\tlibz.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libz.so.1\n")
    plan = driver_tree.plan(driver_tree.parse_ldconfig(ldconfig_p(host) + extra), VERSION, str(host))
    assert "libcuda.so" not in plan["libraries"] and "libz.so.1" not in plan["libraries"]
    assert plan["libraries"]["libcuda.so.1"] == f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert driver_tree.plan(driver_tree.parse_ldconfig(ldconfig_p(host)), "580.172.08", str(host))["libraries"] == {}


def test_resolve_keeps_absolute_links_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "real.so.1").write_text("x")
    (tmp_path / "usr" / "lib" / "abs.so.1").symlink_to("/usr/lib/real.so.1")
    assert driver_tree.resolve(str(tmp_path), "/usr/lib/abs.so.1") == "/usr/lib/real.so.1"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError):
        driver_tree.resolve(str(tmp_path), "/loop")


def test_build_is_idempotent_links_files_and_writes_a_manifest(host: Path, tmp_path: Path) -> None:
    plan = driver_tree.plan(driver_tree.parse_ldconfig(ldconfig_p(host)), VERSION, str(host))
    dest = host / "var" / "lib" / "gpunode" / "nvidia"
    assert driver_tree.build(plan, str(host), str(dest), check_mode=True)
    assert not dest.exists()
    first = driver_tree.build(plan, str(host), str(dest))
    assert len(first) == 26 + 5 + 1
    tree = dest / VERSION
    cuda = tree / "lib64" / "libcuda.so.1"
    assert cuda.is_file() and not cuda.is_symlink()
    assert os.path.samefile(cuda, host / "usr" / "lib" / "x86_64-linux-gnu" / f"libcuda.so.{VERSION}")
    assert driver_tree.build(plan, str(host), str(dest)) == []
    manifest = json.loads((tree / driver_tree.MANIFEST).read_text())
    assert manifest["version"] == VERSION and "libcuda.so.1" in manifest["libraries"]
    assert manifest["sources"]["bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    (tree / "lib64" / "libstale.so.1").write_text("left by hand")
    assert driver_tree.build(plan, str(host), str(dest)) == [f"lib64/libstale.so.1 removed (not part of driver {VERSION})"]
    cuda.unlink()
    cuda.write_text("corrupted")
    assert driver_tree.build(plan, str(host), str(dest)) == [f"lib64/libcuda.so.1 <- /usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"]


def test_prune_keeps_what_is_mounted_and_only_touches_gpunodes_trees(tmp_path: Path) -> None:
    for version in ("580.95.05", "580.159.04", "580.172.08"):
        (tmp_path / version).mkdir()
        (tmp_path / version / driver_tree.MANIFEST).write_text("{}")
    (tmp_path / "someone-elses").mkdir()
    assert driver_tree.prune(["580.159.04", "580.172.08"], str(tmp_path), check_mode=True) == ["580.95.05"]
    assert (tmp_path / "580.95.05").exists()
    assert driver_tree.prune(["580.159.04", "580.172.08"], str(tmp_path)) == ["580.95.05"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["580.159.04", "580.172.08", "someone-elses"]


def test_read_version(host: Path, tmp_path: Path) -> None:
    assert driver_tree.read_version(str(tmp_path)) == ""
    (tmp_path / "sys" / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text(f"{VERSION}\n")
    assert driver_tree.read_version(str(tmp_path)) == VERSION


def test_the_tree_served_cuda_torch_and_nvidia_smi_on_the_h200(host: Path) -> None:
    """probe_tree.py built the tree on the H200 from its real ld cache and ran, with only the tree on
    the loader's path, the CUDA probe, a torch matmul and the tree's nvidia-smi."""
    probe = json.loads((TREE_PROBE).read_text())
    planned = driver_tree.plan(driver_tree.parse_ldconfig(ldconfig_p(host)), VERSION, str(host))
    assert probe["version"] == VERSION and probe["tree"] == sorted(planned["libraries"])
    assert probe["binaries"] == sorted(planned["binaries"])
    for run in ("cuda_probe", "torch"):
        assert probe[run]["rc"] == 0, probe[run]["stderr"]
        maps = json.loads(probe[run]["stdout"].split("MAPS ")[1].replace("'", '"'))
        assert maps and all(f"/{VERSION}/lib64/" in path for path in maps), maps  # the tree's, not the system's
    cuda = json.loads(probe["cuda_probe"]["stdout"].splitlines()[0])
    assert cuda["ok"] and cuda["cuinit"] == 0 and cuda["devices"][0]["name"] == "NVIDIA H200"
    assert probe["nvidia_smi"] == {"rc": 0, "stdout": f"NVIDIA H200, {VERSION}\n", "stderr": ""}
