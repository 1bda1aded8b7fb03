"""The one door from the product to the lab: gpunode never imports the lab (the gpunode-lab
distribution in lab/); it asks for the lab's entry points by name.

Production code knows a lab host by its host file (``lab: true``, ``image.lab_stand_in``); what it
needs of the lab itself goes through here: the stand-in server's image tag (which the lab builds),
the NVML module that image gives the GPU exporter, and the ``gpunode lab`` commands.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "gpunode.lab"
INSTALL = "from a gpunode checkout, pip install -e . -e ./lab (scripts/setup does; the gpunode-lab distribution)"


class LabMissing(LookupError):
    """The lab is not installed here."""


def _entry(name: str) -> Any:
    found = entry_points(group=GROUP, name=name)
    for entry in found:
        try:
            return entry.load()
        except ImportError as exc:
            raise LabMissing(f"the lab is installed but does not import ({exc}): {INSTALL}") from None
    raise LabMissing(f"the lab is not installed here: {INSTALL}")


def installed() -> bool:
    return bool(entry_points(group=GROUP, name="main"))


def stand_in_tag() -> str:
    """The tag of the lab's stand-in server image (a hash of its files: a changed stand-in, a new tag)."""
    return str(_entry("stand_in_tag")())


def stand_in_nvml_module() -> str:
    """The NVML module the stand-in image gives gpunode's GPU exporter (a replay of a recorded GPU)."""
    return str(_entry("stand_in_nvml_module")())


def main(argv: list[str]) -> int:
    """``gpunode lab ARGS``: the lab's own command line; its exit code."""
    return int(_entry("main")(argv))
