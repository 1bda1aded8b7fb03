"""validate and plan: a host file read, and what provision would do, without changing anything."""

from __future__ import annotations

from typing import Annotated

import typer

from gpunode.cli.common import app, _die, _load, _with_codes
from gpunode.cli.options import HostFileArg, JsonOpt
from gpunode.ground.exitcodes import BAD_INPUT, FAILED, UNREACHABLE


@app.command()
def validate(path: HostFileArg) -> None:
    """Check a host file and print nothing but errors (exit 2) or 'valid'."""
    hf = _load(path)
    typer.echo(f"{path}: valid ({len(hf.hosts)} host{'s' if len(hf.hosts) != 1 else ''})")


@app.command()
def plan(
    path: HostFileArg,
    as_json: JsonOpt = False,
    live: Annotated[bool, typer.Option(
        "--live", help="also read (never write) the Proxmox API: is the container's vmid free, gpunode's, "
                       "or someone else's? Which Proxmox VE version, and what would apply at once or wait "
                       "for the container's restart? And each node's server: would a provision keep it or restart "
                       "it, and why?")] = False,
) -> None:
    """Show what provision would do, without contacting anything (--live reads the Proxmox API and each node's server)."""
    from gpunode.derive import plan as planning
    from gpunode.render import print_plan

    hf = _load(path)
    plans = planning.make_plan(hf)
    if live:
        from gpunode.stages.container.client import PveError, PveUnreachable
        from gpunode.stages.container.live import inspect

        for index, (host, host_plan) in enumerate(zip(hf.hosts, plans)):
            try:
                host_plan.ownership = inspect(host).as_dict()
            except LookupError as exc:
                _die(BAD_INPUT, [f"{path}: hosts[{index}].api.auth: {exc} (plan --live reads secrets from env or "
                                 "file)"])
            except PveUnreachable as exc:
                _die(UNREACHABLE, [f"{host.name}: {exc}"])
            except PveError as exc:
                _die(FAILED, [f"{host.name}: {exc}"])
        from gpunode.rolling.forecast import foresee

        forecasts = foresee(list(hf.hosts))
        for host, host_plan in zip(hf.hosts, plans):
            forecast = forecasts[host.name]
            host_plan.forecast = {"action": forecast.action, "reason": forecast.reason, "line": forecast.line()}
    router = planning.router_plan(hf)
    if as_json:
        typer.echo(planning.as_json(plans, router))
    else:
        from rich.console import Console

        from gpunode.render import print_router_plan

        console = Console(highlight=False, soft_wrap=True)
        print_plan(plans, console)
        if router is not None:
            print_router_plan(router, console)


_with_codes(validate, "validate")
_with_codes(plan, "plan")
