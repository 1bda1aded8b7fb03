"""``gpunode lab``: bring the lab up, take it down, show it (gpunode's CLI hands its arguments here
through gpunode.ground.labdoor)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gpunode.ground import exitcodes
from gpunode.ground.text import one_line

app = typer.Typer(help="The local lab: Docker, an LXC container with fake GPU device nodes, fakepve.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
CODES = exitcodes.help_text("lab up / down")


def _progress(line: str) -> None:
    typer.echo(f"lab: {line}", err=True)


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {one_line(str(exc))}", err=True)
    raise typer.Exit(exitcodes.ENVIRONMENT)


@app.command("up", help=f"Bring the lab up (idempotent; needs root).\n\n{CODES}")
def up() -> None:
    from gpunode_lab import LabError, SITES, up as lab_up

    try:
        info = lab_up(_progress)
    except LabError as exc:
        _fail(exc)
    nodes = ", ".join(f"{name} {numbers}" for name, numbers in info.device_nodes.items())
    typer.echo(f"lab is up ({'changed: ' + ', '.join(info.changed) if info.changed else 'no change'}, {info.seconds} s)\n"
               f"  PVE host:  {info.host_container} at {info.ssh_user}@{info.host_ip} (facts: {info.host_facts_root})\n"
               f"  GPU node:  {info.container} at {info.ssh_user}@{info.container_ip} (ssh -i {info.ssh_key})\n"
               f"  devices:   {nodes}\n"
               f"  Proxmox:   fakepve at {info.pve_url} node {info.pve_node}, CA {info.pve_ca}\n"
               + "".join(f"  fleet:     {site.name}: host {site.host.name} at {info.ssh_user}@{site.host.ip}, GPU node "
                         f"{site.gpu.name} at {site.gpu.ip}, fakepve at {site.pve_url}\n" for site in SITES[1:])
               + "  next:      gpunode provision inventory/lab/host.yml (one host), inventory/lab/fleet.yml (the fleet)")


@app.command("down", help=f"Take the lab down: container, bridge rules, fakepve.\n\n{CODES}")
def down(purge: Annotated[bool, typer.Option("--purge", help="also delete /var/lib/gpunode-lab")] = False) -> None:
    from gpunode_lab import LabError, down as lab_down

    try:
        lab_down(purge, _progress)
    except LabError as exc:
        _fail(exc)


@app.command("status")
def status() -> None:
    """Print the lab's state as JSON."""
    from gpunode_lab import status as lab_status

    typer.echo(json.dumps(lab_status(), indent=2, default=str))


def main(argv: list[str]) -> int:
    """Run ``gpunode lab`` with ``argv``; the exit code. A usage error is one line, as gpunode's own."""
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

    try:
        result = typer.main.get_command(app).main(args=argv, prog_name="gpunode lab", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        return exc.exit_code  # the help is printed already
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "gpunode lab"
        typer.echo(f"error: {one_line(exc.format_message())} ({where} --help)", err=True)
        return exc.exit_code
    except ClickException as exc:
        typer.echo(f"error: {one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    return result if isinstance(result, int) else 0
