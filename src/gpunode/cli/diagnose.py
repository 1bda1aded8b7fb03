"""gpunode diagnose: the failures in an SGLang server log, named, each with its cause and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from gpunode.cli.common import app, _die, _one_host, _with_codes
from gpunode.cli.options import HostOpt, HostsFileOpt, JsonOpt
from gpunode.ground.exitcodes import BAD_INPUT, FAILED, OK, UNREACHABLE

if TYPE_CHECKING:
    from gpunode.hostfile import Host


@app.command()
def diagnose(
    log: Annotated[Optional[str], typer.Argument(help="a server log file, or - for standard input")] = None,
    path: HostsFileOpt = None,
    host: HostOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Name the failures in an SGLang server log: line, cause and fix of each.

    Ordered by where the failure began; the signatures serve uses when a start fails. Lines are
    cut to 4096 characters; of a file longer than 256 MiB, the first 16 and the last 240 MiB are
    read. A FIFO, device, socket or directory is refused, as is a terminal on standard input.
    --hosts HOST_FILE reads the server container's log on the node instead; --json prints
    {"findings": [{"id", "summary", "cause", "fix", "line"}]}."""
    from gpunode.stages.serve.diagnose import finding_as_dict, findings, scan
    from gpunode.stages.serve.logread import LogUnreadable, open_log
    from gpunode.ground.text import one_line

    if host is not None and path is None:
        _die(BAD_INPUT, ["--host picks a host of the host file: give it with --hosts"])
    if (log is None) == (path is None):
        _die(BAD_INPUT, ["give a log file, - for standard input, or --hosts HOST_FILE for the node's server log"])
    if path is not None:
        found = findings(_server_log(_one_host(path, host)))
    else:
        try:
            with open_log(str(log)) as source:
                found = scan(source.chunks()).findings()
        except LogUnreadable as exc:
            _die(BAD_INPUT, [str(exc)])
        if source.note:
            typer.echo(f"note: {one_line(source.note)}", err=True)
    if as_json:
        typer.echo(json.dumps({"findings": [finding_as_dict(f) for f in found]}, indent=2))
    elif not found:
        typer.echo("no failure found in the log")
    for finding in ([] if as_json else found):
        # The log's line as text that drives no terminal: a log may carry escape sequences.
        typer.echo(f"{finding.code}: {finding.message}\n  line:  {one_line(finding.evidence)}\n  cause: {finding.cause}\n"
                   f"  fix:   {finding.fix}")
    raise typer.Exit(FAILED if any(f.code == "unknown" for f in found) else OK)


def _server_log(chosen: Host) -> str:
    """The server container's log on the node, through the SSH forward to its Docker engine."""
    import docker

    from gpunode.stages.engine import EngineUnreachable, docker_client, forward
    from gpunode.derive.serverspec import CONTAINER_NAME

    try:
        with forward(chosen.container.reach) as fw:
            client = docker_client(fw.docker_url)
            try:
                return str(client.containers.get(CONTAINER_NAME).logs(tail=5000).decode(errors="replace"))
            finally:
                client.close()
    except (EngineUnreachable, docker.errors.DockerException) as exc:
        _die(UNREACHABLE, [f"cannot read {CONTAINER_NAME}'s log on {chosen.container.reach.address}: {exc}"])


_with_codes(diagnose, "diagnose")
