"""Whether the suite runs under CI, read from the ``CI`` environment variable as a boolean.

Under CI a missing lab or Docker engine is a failure, not a skip; CI systems spell the variable
differently (``true``, ``1``, ``yes``), and a spelling this file does not know is refused rather than
read as "not CI", which would turn every lab test into a skip.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"", "0", "false", "no", "off"})


class CiValueError(ValueError):
    pass


def under_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True for CI=1/true/yes/on (any case), False when unset or 0/false/no/off/empty."""
    env = os.environ if environ is None else environ
    raw = env.get("CI")
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise CiValueError(f"environment variable CI={raw!r} is not a boolean: use one of "
                       f"{', '.join(sorted(TRUE))} (under CI) or {', '.join(sorted(FALSE - {''}))} (not)")


def debian_tool(tool: str, package: str) -> str:
    """``tool``'s path (a Debian package's, which scripts/setup installs); without it the calling test
    skips saying so, and under CI it fails."""
    import shutil

    import pytest

    found = shutil.which(tool)
    if found is None:
        if under_ci():
            pytest.fail(f"{tool} is missing under CI: scripts/setup installs Debian's {package} package")
        pytest.skip(f"{tool} is not installed (Debian: apt install {package}; scripts/setup does it)")
    return found
