"""The gpunode.core collection as its ecosystem uses it, from any folder: ansible-doc renders every
module, each stage playbook is addressed by its FQCN, and the filters are found outside
provision.yml's folder (they once were not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.ground.paths import ANSIBLE_CFG, COLLECTION, PLAYBOOKS

BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("*.py"))
STAGES = sorted(p.stem for p in (PLAYBOOKS / "stages").glob("*.yml"))


def ansible(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_every_module_is_there() -> None:
    assert MODULES == ["gpu_host_findings", "gpunode_stage", "nvidia_device_facts", "nvidia_driver_tree", "nvidia_host_facts",
                       "pve_lxc_gpu"]


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders(module: str, tmp_path: Path) -> None:
    result = ansible("ansible-doc", f"gpunode.core.{module}", cwd=tmp_path)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert "AUTHOR: gpunode developers" in result.stdout
    assert "EXAMPLES:" in result.stdout and "RETURN VALUES:" in result.stdout


@pytest.mark.parametrize("stage", STAGES)
def test_stage_playbook_by_fqcn(stage: str, tmp_path: Path) -> None:
    result = ansible("ansible-playbook", f"gpunode.core.stages.{stage}", "--syntax-check", "-i", "localhost,",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"core/playbooks/stages/{stage}.yml" in result.stdout


def test_filters_found_from_any_folder(tmp_path: Path) -> None:
    result = ansible("ansible", "localhost", "-c", "local", "-i", "localhost,", "-e",
                     f"ansible_python_interpreter={sys.executable}", "-m", "ansible.builtin.debug", "-a",
                     "msg={{ 'options vfio-pci ids=10de:2bb1,8086:1234' | gpunode.core.nvidia_vfio_ids }}",
                     cwd=tmp_path)
    assert result.returncode == 0 and '"10de:2bb1"' in result.stdout, result.stdout + result.stderr
