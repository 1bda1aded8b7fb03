"""The one path every stage takes from the command line (provision, the stage verbs, and the verbs
that also run on this machine with --local): every flag and name checked, then the playbook."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from gpunode.cli.common import _die, _err, _load, _names
from gpunode.ground.exitcodes import BAD_INPUT

if TYPE_CHECKING:
    from gpunode.hostfile import HostFile


def _limit_names(hf: HostFile) -> list[str]:
    """What --limit takes: the host file's hosts, their GPU nodes (inventory names) and its router."""
    from gpunode.derive import ROUTER_NODE, node_name

    return [*(host.name for host in hf.hosts), *(node_name(host) for host in hf.hosts),
            *([ROUTER_NODE] if hf.router is not None else [])]


def run_stages(path: Path, tags: list[str] | None, start: str | None, *, check: bool, diff: bool,
               limit: str | None, restart_container: bool = False, recreate_container: bool = False,
               adopt: bool = False, rolling: bool | None = None, vault_password_file: Path | None = None,
               as_json: bool = False, verbose: int = 0) -> NoReturn:
    """The collection's provision playbook through ansible-runner, the stages selected by tags, a
    recap from runner stats. Every flag and name is checked first: nothing runs on bad input."""
    from gpunode.ground import stagelist as stage_list

    allowing = [flag for flag, given in (("--restart-container", restart_container),
                                         ("--recreate-container", recreate_container), ("--adopt", adopt)) if given]
    if check and allowing:
        _die(BAD_INPUT, [f"--check with {', '.join(allowing)}: --check changes nothing, {' and '.join(allowing)} "
                         f"allow{'s' if len(allowing) == 1 else ''} a change; give one or the other"])
    tags = _names("--tags", tags, stage_list.STAGE_NAMES, "stage") if tags is not None else None
    if start is not None and not start.strip():
        _die(BAD_INPUT, [f"--from '': an empty stage name (stages: {', '.join(stage_list.STAGE_NAMES)})"])
    if tags and start in stage_list.STAGE_NAMES:
        before = [name for name in tags if stage_list.STAGE_NAMES.index(name) < stage_list.STAGE_NAMES.index(start)]
        if before:
            verb = "comes" if len(before) == 1 else "come"
            _die(BAD_INPUT, [f"--tags {','.join(before)} with --from {start}: {', '.join(before)} {verb} before "
                             f"{start} and would not run; give --tags or --from"])
    hf = _load(path)
    if rolling is True and hf.router is None:
        _die(BAD_INPUT, [f"{path}: --rolling: the host file has no router: section, so there is no server to take out "
                         "of one (hosts without a router restart together)"])
    if rolling is True and (check or adopt):
        _die(BAD_INPUT, [f"--rolling with {'--check' if check else '--adopt'}: "
                         + ("--check changes nothing, so nothing rolls" if check else
                            "--adopt takes containers over in one run; give one or the other")])
    if limit is not None:
        _names("--limit", [limit], _limit_names(hf), "host", where=f"{path}: --limit: ")
    try:
        chosen = stage_list.select(tags, start)
    except ValueError as exc:
        _die(BAD_INPUT, [str(exc)])
    if hf.router is None and "router" in chosen:
        if tags and "router" in tags:
            _die(BAD_INPUT, [f"{path}: --tags router: the host file has no router: section"])
        chosen = [name for name in chosen if name != "router"]  # nothing to route: not a stage of this file
    if not any(host.monitor for host in hf.hosts) and "monitor" in chosen:
        if tags and "monitor" in tags:
            _die(BAD_INPUT, [f"{path}: --tags monitor: no host of the file has a monitor: section"])
        chosen = [name for name in chosen if name != "monitor"]  # nothing to watch: not a stage of this file
    lab_skipped: dict[str, str] = {}
    if not tags and all(host.lab for host in hf.hosts):
        # Left out only where every host leaves it out (a stand-in on each host runs serve and smoke).
        each = [stage_list.lab_leaves_out(bool(host.image.lab_stand_in)) for host in hf.hosts]
        lab_skipped = {name: each[0][name] for name in chosen if all(name in left for left in each)}
        chosen = [name for name in chosen if name not in lab_skipped]
    if not chosen:
        _die(BAD_INPUT, ["no stage selected: a lab host without a GPU leaves out p2p (and without a stand-in "
                         "image, serve and smoke); name one with --tags"])
    if adopt and "container" not in chosen:
        _die(BAD_INPUT, ["--adopt takes over a container: it needs the container stage, which is not selected"])
    restarting = [flag for flag in allowing if flag != "--adopt"]
    if restarting and "container" not in chosen:
        _die(BAD_INPUT, [f"{', '.join(restarting)}: the container stage does that, and it is not selected"])

    from rich.console import Console

    from gpunode import inventory
    from gpunode.runner import SecretUnavailable, print_recap, secret_files
    from gpunode.runner import provision as run_provision

    console = _err()
    try:
        with secret_files(hf) as secrets:
            # Said once the input is known to be good (bad input prints nothing but its error).
            for name, why in lab_skipped.items():
                console.print(f"lab: not running stage {name}: {why} "
                              f"(--tags {name} runs it anyway)", markup=False)
            def one_run(names: list[str], hosts: list[str] | None) -> Any:
                return run_provision(
                    hf, names, check=check, diff=diff, verbosity=verbose, console=console, secrets=secrets,
                    limit=inventory.limit_pattern(hf, limit if hosts is None else ",".join(hosts)),
                    extravars={"gpunode_allow_restart": restart_container,
                               "gpunode_allow_recreate": recreate_container},
                    vault_password_file=vault_password_file, adopt=adopt)

            roll = None
            if check or adopt:
                summary = one_run(chosen, None)
            else:
                from gpunode.rolling.roll import run as rolled

                summary, roll = rolled(hf, chosen, limit, rolling, restart_container or recreate_container, one_run,
                                       console)
    except SecretUnavailable as exc:
        _die(BAD_INPUT, [f"{path}: {exc}"])
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps({**asdict(summary), "roll": roll.as_dict() if roll is not None else None}, indent=2))
    else:
        print_recap(summary, Console(highlight=False))
    raise typer.Exit(summary.exit_code)


def stage_or_local(name: str, path: Path | None, local: bool, local_only: dict[str, object], *,
                   check: bool, diff: bool, limit: str | None, vault_password_file: Path | None, as_json: bool,
                   verbose: int, json_local: bool = True) -> None:
    """A stage verb that also runs on this machine: without --local it is the stage (a host file is
    needed, the options of --local are refused); with --local it returns and the caller runs here
    (the stage's own options refused: nothing here would read them; ``json_local``: --local has a
    JSON output)."""
    if local:
        stage_only = [option for option, value in (
            ("--check", check), ("--diff", diff), ("--limit", limit), ("--vault-password-file", vault_password_file),
            ("-v", verbose), ("--json", as_json and not json_local)) if value not in (None, False, 0)]
        if stage_only:
            _die(BAD_INPUT, [f"{', '.join(stage_only)}: not with --local (the {name} stage's, on the node; --local "
                             "runs here)"])
        return
    given = [option for option, value in local_only.items() if value not in (None, False)]
    if given:
        _die(BAD_INPUT, [f"{', '.join(given)}: only with --local (without it, `gpunode {name}` runs the {name} stage "
                         "on the node from the host file)"])
    if path is None:
        _die(BAD_INPUT, [f"gpunode {name}: give the host file (the {name} stage runs on its node), or --local for "
                         "this machine"])
    run_stages(path, [name], None, check=check, diff=diff, limit=limit, vault_password_file=vault_password_file,
               as_json=as_json, verbose=verbose)
