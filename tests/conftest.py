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
