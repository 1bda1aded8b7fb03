"""gpunode lab: the local lab, passed through to the lab package when it is installed."""

from __future__ import annotations

import typer

from gpunode.cli.common import app, _die, _with_codes
from gpunode.ground.exitcodes import ENVIRONMENT


@app.command("lab", add_help_option=False,
              context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def lab(ctx: typer.Context) -> None:
    """The local lab (up, down, status): Docker, an LXC container with fake GPU device nodes, fakepve.
    Installed with the lab extra; `gpunode lab --help` says more."""
    from gpunode.ground import labdoor

    try:
        code = labdoor.main(list(ctx.args))
    except labdoor.LabMissing as exc:
        _die(ENVIRONMENT, [str(exc)])
    raise typer.Exit(code)


_with_codes(lab, "lab up / down")
