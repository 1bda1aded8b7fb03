"""What a host file's refusal says, line by line, as the tests compare it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.hostfile import HostFileError, load


def problems(path: Path) -> list[str]:
    """Each problem ``load`` names for ``path``, without the path in front; fails when it loads."""
    with pytest.raises(HostFileError) as caught:
        load(path)
    return [line.removeprefix(f"{path}: ") for line in caught.value.problems]
