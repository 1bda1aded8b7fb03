"""provision, and the verbs of the stages that only run on the node: host, container, node, router."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gpunode.cli.common import STAGE_CODES, app, _with_codes
from gpunode.cli.options import CheckOpt, DiffOpt, HostFileArg, JsonOpt, LimitOpt, RollingOpt, VaultOpt, VerboseOpt
from gpunode.cli.stagerun import run_stages


@app.command()
def provision(
    path: HostFileArg,
    check: CheckOpt = False,
    diff: DiffOpt = False,
    limit: LimitOpt = None,
    tags: Annotated[Optional[list[str]], typer.Option("--tags", help="only these stages (comma list)")] = None,
    start: Annotated[Optional[str], typer.Option("--from", help="start at this stage, run the rest")] = None,
    restart_container: Annotated[bool, typer.Option(
        "--restart-container", help="restart a running container when device changes need it")] = False,
    recreate_container: Annotated[bool, typer.Option(
        "--recreate-container", help="re-create the container when a change needs it (DESTROYS its disk)")] = False,
    adopt: Annotated[bool, typer.Option(
        "--adopt", help="take over an existing container gpunode did not make: show the full diff, then "
                        "converge and mark it")] = False,
    rolling: RollingOpt = None,
    vault_password_file: VaultOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Run the provision playbook: host, container, node, model, image, p2p, serve, smoke (router, monitor).

    An existing container without gpunode's tag is never changed (exit 1, naming it) unless
    --adopt is given, and never destroyed (--recreate-container refuses it even with --adopt).
    With a router, a change that restarts serving servers goes one batch of hosts at a time, each
    taken out of the router first (README "Day two").
    """
    run_stages(path, tags, start, check=check, diff=diff, limit=limit,
               restart_container=restart_container, recreate_container=recreate_container, adopt=adopt,
               rolling=rolling, vault_password_file=vault_password_file, as_json=as_json, verbose=verbose)


def _stage_verb(name: str, summary: str) -> None:
    """`gpunode <stage> host.yml`: that stage alone, on every host of the file (or --limit), through
    the same path as provision."""

    def verb(path: HostFileArg, check: CheckOpt = False, diff: DiffOpt = False, limit: LimitOpt = None,
             vault_password_file: VaultOpt = None, as_json: JsonOpt = False, verbose: VerboseOpt = 0) -> None:
        run_stages(path, [name], None, check=check, diff=diff, limit=limit,
                   vault_password_file=vault_password_file, as_json=as_json, verbose=verbose)

    verb.__doc__ = f"The {name} stage alone: {summary} (provision --tags {name})."
    _with_codes(verb, STAGE_CODES)
    app.command(name)(verb)


# The stages whose verbs live in gpunode.cli.local and gpunode.cli.image: they also run on this machine (--local).
LOCAL_VERBS = ("image", "p2p", "serve", "smoke")


def _stage_verbs() -> None:
    """Every stage but those with --local: only the stage, through provision's path."""
    from gpunode.ground.stagelist import STAGES

    for stage in STAGES:
        if stage.name not in LOCAL_VERBS:
            _stage_verb(stage.name, stage.summary)


_stage_verbs()
_with_codes(provision, "provision")
