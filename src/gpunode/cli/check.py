"""gpunode check: testinfra checks by layer, one per stage, on every host of the file."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gpunode.cli.common import app, _die, _load, _names, _with_codes
from gpunode.cli.options import HostFileArg, JsonOpt
from gpunode.ground.exitcodes import BAD_INPUT, ENVIRONMENT


@app.command()
def check(
    path: HostFileArg,
    layers: Annotated[Optional[list[str]], typer.Option("--layer", help="only these layers (comma list)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Is this node right? testinfra checks by layer, one per stage; several hosts are checked side
    by side, each reported by name.

    Layers: host, container, node, model, image, p2p, serve, smoke, router, monitor.
    """
    from gpunode.checks import LAYERS

    chosen = _names("--layer", layers, LAYERS, "layer") if layers is not None else []
    hf = _load(path)
    if chosen == ["router"] and hf.router is None:
        _die(BAD_INPUT, [f"{path}: --layer router: the host file has no router: section"])
    if chosen == ["monitor"] and not any(host.monitor for host in hf.hosts):
        _die(BAD_INPUT, [f"{path}: --layer monitor: no host of the file has a monitor: section"])

    from rich.console import Console

    from gpunode.checks.run import as_json as report_json
    from gpunode.checks.run import render, run_checks
    from gpunode.runner import SecretUnavailable, secret_files

    try:
        import pytest  # noqa: F401 - runtime dependencies of check, named if a broken install lacks them
        import testinfra  # noqa: F401
    except ImportError as exc:
        _die(ENVIRONMENT, [f"no check ran: gpunode check needs pytest and pytest-testinfra ({exc}); "
                           f"reinstall gpunode, which depends on both"])

    try:
        with secret_files(hf) as secrets:
            report = run_checks(hf, secrets, chosen or None)
    except SecretUnavailable as exc:
        _die(BAD_INPUT, [f"{path}: {exc}"])
    if as_json:
        typer.echo(report_json(report))
    else:
        render(report, Console(highlight=False, soft_wrap=True))
    raise typer.Exit(report.exit_code)


_with_codes(check, "check")
