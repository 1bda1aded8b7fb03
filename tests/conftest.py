from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPUNODE = [sys.executable, "-m", "gpunode"]


def _runner(state: Path):
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "GPUNODE_STATE_DIR": str(state), "COLUMNS": "200", **(env or {})}
        return subprocess.run([*GPUNODE, *args], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT)

    return run


@pytest.fixture
def gpunode(tmp_path: Path):
    """Run the real CLI in a subprocess with a private state dir; returns CompletedProcess."""
    return _runner(tmp_path / "state")


@pytest.fixture(scope="module")
def gpunode_module(tmp_path_factory: pytest.TempPathFactory):
    """The same, for module-scoped fixtures."""
    return _runner(tmp_path_factory.mktemp("state"))


# CI runs the suite on two workers (pytest-xdist; pyproject.toml's addopts): the lab's tests share
# one lab and run one after another on one worker, the real-engine tests (images and Docker) share
# their session-built images on the other; each unit test goes where there is room. The lab's
# tests mostly wait on SSH and Ansible, the image builds mostly on PyPI and the disk, so the two
# overlap instead of adding up. (xdist's own loadgroup cannot be used: its group suffix is lost
# on pytest 9's node ids.)
XDIST_GROUPS = {"lab": "lab", "image": "engine", "docker": "engine"}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ByFolder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/", 2)
            return XDIST_GROUPS.get(parts[1], nodeid) if len(parts) == 3 and parts[0] == "tests" else nodeid

    return ByFolder(config, log)
