"""Build the router's image (gpunode.derive.routerimage) with the server image's machinery: its
base handling and build display; never twice on one engine (the tag is the content)."""

from __future__ import annotations

from rich.console import Console

from gpunode.catalogue import bases
from gpunode.derive.routerimage import RouterInputs
from gpunode.stages.image.base import ensure_debootstrap_base, ensure_registry_base, image_exists
from gpunode.stages.image.build import BuildDisplay, stream_build


def build(client: object, inputs: RouterInputs, console: Console) -> bool:
    """Build the router image on ``client``'s engine unless its tag is there; True when built."""
    if image_exists(client, inputs.tag):  # type: ignore[arg-type]
        return False
    if inputs.debootstrap is not None:
        ensure_debootstrap_base(client, inputs.debootstrap, console)  # type: ignore[arg-type]
    else:
        ensure_registry_base(client, bases.parse(inputs.base), console)  # type: ignore[arg-type]
    with BuildDisplay(console) as display:
        stream_build(client, inputs, inputs.tag, display)  # type: ignore[arg-type]
    return True
