"""Fixtures the unit tests of the container stage share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.container.client import Connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.pve import connection  # noqa: E402 - tests/ put on the path just above


@pytest.fixture
def conn(fakepve: Any, fakepve_cafile: str) -> Connection:
    """A connection to the in-process fakepve (fakepve's pytest plugin) as root@pam."""
    return connection(fakepve.url, fakepve_cafile)
