"""Fixtures the unit tests share: the container stage's fakepve connection, SSH key pairs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.container.client import Connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.keys import KEY_KINDS  # noqa: E402 - tests/ put on the path just above
from fakes.pve import connection  # noqa: E402


@pytest.fixture
def conn(fakepve: Any, fakepve_cafile: str) -> Connection:
    """A connection to the in-process fakepve (fakepve's pytest plugin) as root@pam."""
    return connection(fakepve.url, fakepve_cafile)


@pytest.fixture(scope="module")
def key_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh key pair of each kind, made by ssh-keygen: name -> private key file (.pub beside it)."""
    assert shutil.which("ssh-keygen"), "ssh-keygen (openssh-client) is needed: it makes the keys and is the oracle"
    folder = tmp_path_factory.mktemp("keys")
    made = {}
    for name, args in KEY_KINDS.items():
        path = folder / f"id_{name}"
        subprocess.run(["ssh-keygen", "-q", *args, "-N", "", "-C", f"{name}@test", "-f", str(path)], check=True,
                       capture_output=True, timeout=60)
        made[name] = path
    return made
