"""The wheel works from any folder: built from this checkout, installed into a fresh venv in a
temporary folder outside it, and every command run from there finds what it needs (the
gpunode.core collection, ansible.cfg, the image inputs, the profiles), with no GPUNODE_HOME. The
wheel holds no lab code: the lab is a distribution of its own (lab/), installed beside it for the
lab host's provision."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
OOM_LOG = ROOT / "tests" / "fixtures" / "serve" / "oom.log"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpunode's console script in a fresh venv holding only the wheel and its dependencies."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where / "dist"), str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    wheel = next((where / "dist").glob("gpunode-0*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=120)
    subprocess.run([str(where / "venv" / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=900, capture_output=True)
    return where / "venv" / "bin" / "gpunode"


@pytest.fixture(scope="module")
def with_lab(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same venv with the lab's own wheel added (gpunode-lab: the stand-in server's image tag)."""
    where = tmp_path_factory.mktemp("lab-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where), str(ROOT / "lab")],
                   check=True, timeout=600, capture_output=True)
    subprocess.run([str(installed.parent / "pip"), "install", "-q", "--disable-pip-version-check",
                    str(next(where.glob("gpunode_lab-*.whl")))], check=True, timeout=900, capture_output=True)
    return installed


def run(gpunode: Path, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("GPUNODE_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(GPUNODE_STATE_DIR=str(tmp_path / "state"), COLUMNS="200", PATH=f"{gpunode.parent}:{env['PATH']}")
    return subprocess.run([str(gpunode), *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)


def test_the_wheel_holds_the_collection_outside_the_checkout(installed: Path) -> None:
    site = subprocess.run([str(installed.parent / "python"), "-c", "import gpunode.ground.paths as p; print(p.COLLECTION)"],
                          capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    assert not site.startswith(str(ROOT)) and (Path(site) / "galaxy.yml").is_file()


def test_the_wheel_holds_no_lab_code(installed: Path) -> None:
    import zipfile

    wheel = next(installed.parents[2].glob("dist/gpunode-0*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("gpunode/stages/") for name in names)
    assert [name for name in names if name.startswith(("gpunode_lab/", "gpunode/lab/"))] == []
    found = subprocess.run([str(installed.parent / "python"), "-c", "import gpunode_lab"], capture_output=True, cwd="/")
    assert found.returncode != 0


def test_validate_plan_diagnose_from_another_folder(installed: Path, tmp_path: Path) -> None:
    assert run(installed, "validate", str(EXAMPLE), tmp_path=tmp_path).returncode == 0
    plan = run(installed, "plan", str(EXAMPLE), tmp_path=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "dev11: /dev/nvidia-modeset,mode=0666" in plan.stdout and "tags: gpunode" in plan.stdout
    diagnosed = run(installed, "diagnose", str(OOM_LOG), tmp_path=tmp_path)
    assert diagnosed.returncode == 0 and diagnosed.stdout.startswith("cuda_oom:")
    # No GPU here: p2p runs and says so (exit 4, an environment finding), it does not crash.
    p2p = run(installed, "p2p", "--local", "--json", tmp_path=tmp_path)
    assert p2p.returncode == 4 and '"environment"' in p2p.stdout, p2p.stdout[-2000:] + p2p.stderr[-2000:]


def test_provision_check_and_check_on_the_lab(with_lab: Path, tmp_path: Path) -> None:
    installed = with_lab
    provision = run(installed, "provision", str(LAB_HOSTS), "--check", tmp_path=tmp_path)
    assert provision.returncode == 0, provision.stderr[-3000:]
    assert "recap (successful, check mode)" in provision.stderr + provision.stdout
    check = run(installed, "check", str(LAB_HOSTS), tmp_path=tmp_path)
    assert check.returncode == 0, check.stdout[-3000:]
    assert " 0 failed" in check.stdout.splitlines()[-1]
