"""The gpunode command line. Thin: provision and every stage-named verb run the collection's
playbook through one path (gpunode.runner), ``--local`` runs a stage's code on this machine instead,
and the other verbs are modules of the package. Exit codes are gpunode.exitcodes'.

Heavy modules (pydantic models, ansible-runner, the lab) are imported inside the commands so that
``gpunode --help`` stays fast.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer

# Typer 0.29 carries its own click (typer._click, pinned with it): its exceptions are what the
# command line raises.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer._click.globals import get_current_context
from typer.core import TyperGroup

if TYPE_CHECKING:
    from rich.console import Console
    from typer._click import Command, Context

    from gpunode.hostfile import Host, HostFile

AB_PRESETS_HELP = ("attention (--attention-backend flashinfer,triton)",
                   "moe (--moe-runner-backend flashinfer_cutlass,flashinfer_cutedsl)",
                   "stacks (image.stack sglang-0.5.9-cu128,sglang-0.5.23-cu130)")

def _codes(command: str) -> str:
    from gpunode.exitcodes import help_text

    return help_text(command)


EXIT_CODES_HELP = _codes("provision")
STAGE_CODES = "<stage> (host, container, node, image build, p2p, serve, smoke, router)"


def _with_codes(command: Callable[..., None], *keys: str) -> None:
    """Append the exit codes of ``keys`` (gpunode.exitcodes) to a command's help; a second key is
    its --local variant's."""
    text = inspect.cleandoc(command.__doc__ or "")
    for index, key in enumerate(keys):
        text += "\n\n" + ("--local: " if index else "") + _codes(key)
    command.__doc__ = text


def _takes_json(command: Command | None) -> bool:
    return command is not None and any("--json" in getattr(param, "opts", ()) for param in command.params)


def _json_given(ctx: Context | None, args: Sequence[str]) -> bool:
    """Was --json asked of a command that takes it? From its parsed value once the command runs,
    else (a usage error, before parsing ended) from the arguments."""
    if ctx is None or not _takes_json(ctx.command):
        return False
    if "as_json" in ctx.params:
        return bool(ctx.params["as_json"])
    args = list(args)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _report(code: int, lines: list[str], as_json: bool) -> None:
    """Errors, one line each on stderr, plain text whatever they hold (no Rich markup); with --json
    also one JSON object on stdout, the only thing there."""
    from rich.text import Text

    from gpunode.text import one_line

    console = _err()
    for line in lines:
        console.print(Text.assemble(("error:", "red"), " ", one_line(line)))
    if as_json:
        typer.echo(json.dumps({"error": "; ".join(lines), "errors": lines, "exit_code": code}))


class _Gpunode(TyperGroup):
    """The root command. Every way out is an exit code of gpunode.exitcodes: a usage error is one
    line (not click's usage block) and exit 2; with --json, errors are a JSON object on stdout too."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        # Named gpunode however it was started (python -m, a test runner): usage lines name the command to type.
        code = self._outcome(argv, "gpunode", complete_var, windows_expand_args, extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _outcome(self, argv: list[str], prog_name: str, complete_var: str | None, windows_expand_args: bool,
                 extra: dict[str, Any]) -> int:
        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False,
                                  windows_expand_args=windows_expand_args, **extra)
        except NoArgsIsHelpError as exc:
            return exc.exit_code  # the help is printed already
        except UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else prog_name
            _report(exc.exit_code, [f"{exc.format_message()} ({where} --help)"], _json_given(exc.ctx, argv))
            return exc.exit_code
        except ClickException as exc:
            _report(exc.exit_code, [exc.format_message()], "--json" in argv)
            return exc.exit_code
        except typer.Abort:
            _report(1, ["aborted"], "--json" in argv)
            return 1
        except Exception as exc:
            if "--json" in argv:  # a bug: its traceback follows on stderr, stdout still holds one object
                typer.echo(json.dumps({"error": f"internal error: {type(exc).__name__}: {exc}",
                                       "errors": [f"internal error: {type(exc).__name__}: {exc}"], "exit_code": 1}))
            raise
        return result if isinstance(result, int) else 0


app = typer.Typer(
    cls=_Gpunode,
    help="Provision a Proxmox VE host with NVIDIA GPUs: LXC container, pinned SGLang image, P2P check, server.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
image_app = typer.Typer(help="The pinned server image: build it, verify it.", no_args_is_help=True)
lab_app = typer.Typer(help="The local lab: Docker, an LXC container with fake GPU device nodes, fakepve.",
                      no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.add_typer(image_app, name="image")

HostFileArg = Annotated[Path, typer.Argument(help="the host file (YAML)", show_default=False)]


def _err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _die(code: int, lines: list[str]) -> NoReturn:
    """Stop with ``code``: each line printed as an error (plain text, one line), and with the
    running command's --json the JSON error on stdout."""
    _report(code, lines, _json_given(get_current_context(silent=True), []))
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("gpunode")
        except PackageNotFoundError:  # run from a source tree, not installed
            from gpunode import __version__ as number
        typer.echo(f"gpunode {number}")
        raise typer.Exit(0)


@app.callback()
def _root(show_version: Annotated[bool, typer.Option(
        "--version", help="print gpunode's version and exit", is_eager=True, callback=_version)] = False) -> None:
    pass


def _load(path: Path) -> HostFile:
    from gpunode import hostfile

    try:
        return hostfile.load(path)
    except hostfile.HostFileError as exc:
        _die(2, exc.problems)


@app.command()
def validate(path: HostFileArg) -> None:
    """Check a host file and print nothing but errors (exit 2) or 'valid'."""
    hf = _load(path)
    typer.echo(f"{path}: valid ({len(hf.hosts)} host{'s' if len(hf.hosts) != 1 else ''})")


@app.command()
def plan(
    path: HostFileArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    live: Annotated[bool, typer.Option(
        "--live", help="also read (never write) the Proxmox API: is the container's vmid free, gpunode's, "
                       "or someone else's? Which Proxmox VE version, and what would apply at once or wait "
                       "for the container's restart?")] = False,
) -> None:
    """Show what provision would do, without contacting anything (--live reads the Proxmox API)."""
    from gpunode import plan as planning
    from gpunode.render import print_plan

    hf = _load(path)
    plans = planning.make_plan(hf)
    if live:
        from gpunode.container.client import PveError, PveUnreachable
        from gpunode.container.live import inspect

        for index, (host, host_plan) in enumerate(zip(hf.hosts, plans)):
            try:
                host_plan.ownership = inspect(host).as_dict()
            except LookupError as exc:
                _die(2, [f"{path}: hosts[{index}].api.auth: {exc} (plan --live reads secrets from env or file)"])
            except PveUnreachable as exc:
                _die(3, [f"{host.name}: {exc}"])
            except PveError as exc:
                _die(1, [f"{host.name}: {exc}"])
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


def _names(option: str, values: list[str], known: Sequence[str], kind: str, where: str = "") -> list[str]:
    """The names a comma-list option gives, each one of ``known``, in order, once. An empty value or
    name is bad input (left out, --tags or --limit would mean every stage or host), and so is an
    unknown one; either message lists the names there are. ``where`` begins the unknown's message."""
    items = [item.strip() for value in values for item in value.split(",")]
    there = f"({kind}s: {', '.join(known)})"
    if not items or "" in items:
        _die(2, [f"{option} {','.join(values)!r}: an empty {kind} name {there}"])
    unknown = [item for item in dict.fromkeys(items) if item not in known]
    if unknown:
        _die(2, [f"{where}unknown {kind}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} {there}"])
    return list(dict.fromkeys(items))


def _limit_names(hf: HostFile) -> list[str]:
    """What --limit takes: the host file's hosts, their GPU nodes (inventory names) and its router."""
    from gpunode.derive import ROUTER_NODE, node_name

    return [*(host.name for host in hf.hosts), *(node_name(host) for host in hf.hosts),
            *([ROUTER_NODE] if hf.router is not None else [])]


def _run_stages(path: Path, tags: list[str] | None, start: str | None, *, check: bool, diff: bool,
                limit: str | None, restart_container: bool = False, recreate_container: bool = False,
                adopt: bool = False, vault_password_file: Path | None = None, as_json: bool = False,
                verbose: int = 0) -> NoReturn:
    """The one path every stage takes from the command line: the collection's provision playbook
    through ansible-runner, the stages selected by tags, a recap from runner stats. Every flag and
    name is checked first: nothing runs on bad input."""
    from gpunode import stages as stage_list

    allowing = [flag for flag, given in (("--restart-container", restart_container),
                                         ("--recreate-container", recreate_container), ("--adopt", adopt)) if given]
    if check and allowing:
        _die(2, [f"--check with {', '.join(allowing)}: --check changes nothing, {' and '.join(allowing)} "
                 f"allow{'s' if len(allowing) == 1 else ''} a change; give one or the other"])
    tags = _names("--tags", tags, stage_list.STAGE_NAMES, "stage") if tags is not None else None
    if start is not None and not start.strip():
        _die(2, [f"--from '': an empty stage name (stages: {', '.join(stage_list.STAGE_NAMES)})"])
    if tags and start in stage_list.STAGE_NAMES:
        before = [name for name in tags if stage_list.STAGE_NAMES.index(name) < stage_list.STAGE_NAMES.index(start)]
        if before:
            verb = "comes" if len(before) == 1 else "come"
            _die(2, [f"--tags {','.join(before)} with --from {start}: {', '.join(before)} {verb} before {start} and "
                     "would not run; give --tags or --from"])
    hf = _load(path)
    if limit is not None:
        _names("--limit", [limit], _limit_names(hf), "host", where=f"{path}: --limit: ")
    try:
        chosen = stage_list.select(tags, start)
    except ValueError as exc:
        _die(2, [str(exc)])
    if hf.router is None and "router" in chosen:
        if tags and "router" in tags:
            _die(2, [f"{path}: --tags router: the host file has no router: section"])
        chosen = [name for name in chosen if name != "router"]  # nothing to route: not a stage of this file
    lab_skipped: dict[str, str] = {}
    if not tags and all(host.lab for host in hf.hosts):
        # Left out only where every host leaves it out (a stand-in on each host runs serve and smoke).
        each = [stage_list.lab_leaves_out(bool(host.image.lab_stand_in)) for host in hf.hosts]
        lab_skipped = {name: each[0][name] for name in chosen if all(name in left for left in each)}
        chosen = [name for name in chosen if name not in lab_skipped]
    if not chosen:
        _die(2, ["no stage selected: a lab host without a GPU leaves out p2p (and without a stand-in image, "
                 "serve and smoke); name one with --tags"])
    if adopt and "container" not in chosen:
        _die(2, ["--adopt takes over a container: it needs the container stage, which is not selected"])
    restarting = [flag for flag in allowing if flag != "--adopt"]
    if restarting and "container" not in chosen:
        _die(2, [f"{', '.join(restarting)}: the container stage does that, and it is not selected"])

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
            summary = run_provision(
                hf, chosen, check=check, diff=diff, limit=inventory.limit_pattern(hf, limit), verbosity=verbose,
                console=console, secrets=secrets,
                extravars={"gpunode_allow_restart": restart_container, "gpunode_allow_recreate": recreate_container},
                vault_password_file=vault_password_file, adopt=adopt)
    except SecretUnavailable as exc:
        _die(2, [f"{path}: {exc}"])
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(summary), indent=2))
    else:
        print_recap(summary, Console(highlight=False))
    raise typer.Exit(summary.exit_code)


CheckOpt = Annotated[bool, typer.Option("--check", help="report what would change; change nothing")]
DiffOpt = Annotated[bool, typer.Option("--diff", help="show file and config differences")]
LimitOpt = Annotated[Optional[str], typer.Option("--limit", help="only these hosts, a comma list of the host file's "
                                                 "names: a host (brings its GPU node along), a GPU node NAME-ctVMID, "
                                                 "router")]
JsonRecapOpt = Annotated[bool, typer.Option("--json", help="print the recap as JSON on stdout")]
VerboseOpt = Annotated[int, typer.Option("-v", count=True, help="more Ansible output in the log")]
VaultOpt = Annotated[Optional[Path], typer.Option("--vault-password-file", help="for {vault: PATH} secrets")]
LocalOpt = Annotated[bool, typer.Option("--local", help="run it on THIS machine instead of the node (see --help)")]


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
    vault_password_file: VaultOpt = None,
    as_json: JsonRecapOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Run the provision playbook: host, container, node, image, p2p, serve, smoke.

    An existing container without gpunode's tag is never changed (exit 1, naming it) unless
    --adopt is given, and never destroyed (--recreate-container refuses it even with --adopt).
    """
    _run_stages(path, tags, start, check=check, diff=diff, limit=limit,
                restart_container=restart_container, recreate_container=recreate_container, adopt=adopt,
                vault_password_file=vault_password_file, as_json=as_json, verbose=verbose)


def _stage_verb(name: str, summary: str) -> None:
    """`gpunode <stage> host.yml`: that stage alone, on every host of the file (or --limit), through
    the same path as provision."""

    def verb(path: HostFileArg, check: CheckOpt = False, diff: DiffOpt = False, limit: LimitOpt = None,
             vault_password_file: VaultOpt = None, as_json: JsonRecapOpt = False, verbose: VerboseOpt = 0) -> None:
        _run_stages(path, [name], None, check=check, diff=diff, limit=limit,
                    vault_password_file=vault_password_file, as_json=as_json, verbose=verbose)

    verb.__doc__ = f"The {name} stage alone: {summary} (provision --tags {name})."
    _with_codes(verb, STAGE_CODES)
    app.command(name)(verb)


def _stage_verbs() -> None:
    """host, container, node and router: only the stage; image (build), p2p, serve and smoke have --local too."""
    from gpunode.stages import STAGES

    for stage in (*STAGES[:3], STAGES[-1]):
        _stage_verb(stage.name, stage.summary)


_stage_verbs()


_with_codes(provision, "provision")


def _stage_or_local(name: str, path: Path | None, local: bool, local_only: dict[str, object], *,
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
            _die(2, [f"{', '.join(stage_only)}: not with --local (the {name} stage's, on the node; --local runs "
                     "here)"])
        return
    given = [option for option, value in local_only.items() if value not in (None, False)]
    if given:
        _die(2, [f"{', '.join(given)}: only with --local (without it, `gpunode {name}` runs the {name} stage on the "
                 "node from the host file)"])
    if path is None:
        _die(2, [f"gpunode {name}: give the host file (the {name} stage runs on its node), or --local for this machine"])
    _run_stages(path, [name], None, check=check, diff=diff, limit=limit, vault_password_file=vault_password_file,
                as_json=as_json, verbose=verbose)


@app.command()
def check(
    path: HostFileArg,
    layers: Annotated[Optional[list[str]], typer.Option("--layer", help="only these layers (comma list)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Is this node right? testinfra checks by layer, one per stage; several hosts are checked side
    by side, each reported by name.

    Layers: host, container, node, image, p2p, serve, smoke, router.
    """
    from gpunode.checks import LAYERS

    chosen = _names("--layer", layers, LAYERS, "layer") if layers is not None else []
    hf = _load(path)
    if chosen == ["router"] and hf.router is None:
        _die(2, [f"{path}: --layer router: the host file has no router: section"])

    from rich.console import Console

    from gpunode.check import as_json as report_json
    from gpunode.check import render, run_checks
    from gpunode.runner import SecretUnavailable, secret_files

    try:
        import pytest  # noqa: F401 - runtime dependencies of check, named if a broken install lacks them
        import testinfra  # noqa: F401
    except ImportError as exc:
        _die(4, [f"no check ran: gpunode check needs pytest and pytest-testinfra ({exc}); "
                 f"reinstall gpunode, which depends on both"])

    try:
        with secret_files(hf) as secrets:
            report = run_checks(hf, secrets, chosen or None)
    except SecretUnavailable as exc:
        _die(2, [f"{path}: {exc}"])
    if as_json:
        typer.echo(report_json(report))
    else:
        render(report, Console(highlight=False, soft_wrap=True))
    raise typer.Exit(report.exit_code)


@app.command()
def p2p(
    path: Annotated[Optional[Path], typer.Argument(help="the host file (--local: optional, for its p2p: "
                                                        "expectations and --tp-size)")] = None,
    local: LocalOpt = False,
    host: Annotated[Optional[str], typer.Option("--host", help="--local: which host of the host file")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (--local: every number and finding; "
                                                         "else the recap)")] = False,
    size_mb: Annotated[Optional[int], typer.Option("--size-mb", min=1, help="--local: bytes per bandwidth "
                                                   "copy, MiB (512)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="--local: fewer samples: faster, noisier")] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """The p2p stage on the node: GPU topology and P2P bandwidth (--local: THIS machine's).

    Without --local: inside the server image on the node, the verdict recorded for `gpunode check`.
    With --local: measure this machine and print the report.
    """
    _stage_or_local("p2p", path, local, {"--host": host, "--size-mb": size_mb, "--quick": quick},
                    check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    from gpunode.p2p.command import run as run_p2p
    from gpunode.p2p.verdict import Expectations

    if path is None and host is not None:
        _die(2, ["--host picks a host of the host file: give the host file too"])
    values: dict[str, object] = {}
    if path is not None:
        chosen = _one_host(path, host)
        from gpunode.derive import derive

        values = {**chosen.p2p.model_dump(), "min_gpus": derive(chosen).tp_size}
    raise typer.Exit(run_p2p(as_json=as_json, expect=Expectations.from_mapping(values), size_mb=size_mb or 512,
                             quick=quick, out=sys.stdout))


_with_codes(p2p, STAGE_CODES, "p2p --local")


def _one_host(path: Path, name: str | None):  # -> Host
    hf = _load(path)
    names = [h.name for h in hf.hosts]
    if name is not None and name not in names:
        what = "an empty name" if not name.strip() else "no such host in the file"
        _die(2, [f"{path}: --host {name!r}: {what}; name one host with --host ({', '.join(names)})"])
    if name is None and len(names) > 1:
        _die(2, [f"{path}: name one host with --host ({', '.join(names)})"])
    return hf.hosts[names.index(name) if name is not None else 0]


@app.command()
def serve(
    path: HostFileArg,
    local: LocalOpt = False,
    host: Annotated[Optional[str], typer.Option("--host", help="--local: which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option(
        "--docker-url", help="--local: the Docker engine (default: this machine's, DOCKER_HOST)")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="--local: image tag (default: the host file's)")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=1, help="--local: seconds to wait for "
                                                     "readiness (3600)")] = None,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    as_json: JsonRecapOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The serve stage on the node: start (or keep) the SGLang server until it serves.

    Without --local: on the node's engine with the hand-off the node stage set up, waiting until
    /health_generate answers. With --local: on THIS machine's engine (or --docker-url's), choosing
    the hand-off here.
    """
    _stage_or_local("serve", path, local, {"--host": host, "--docker-url": docker_url, "--image": image,
                                           "--timeout": timeout},
                    check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose,
                    json_local=False)
    chosen = _one_host(path, host)
    from gpunode.derive import server_image
    from gpunode.serve.command import DEFAULT_TIMEOUT_S
    from gpunode.serve.command import serve as run_serve

    raise typer.Exit(run_serve(chosen, image or server_image(chosen), docker_url, _err(), timeout or DEFAULT_TIMEOUT_S))


_with_codes(serve, STAGE_CODES, "serve --local")


@app.command()
def smoke(
    path: Annotated[Optional[Path], typer.Argument(help="the host file (not with --local)")] = None,
    local: LocalOpt = False,
    url: Annotated[Optional[str], typer.Option("--url", help="--local: the server, e.g. http://127.0.0.1:30000")] = None,
    served_name: Annotated[Optional[str], typer.Option("--served-name", help="--local: the model name clients ask "
                                                       "for (glm-5)")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(
        "--api-key-env", help="--local: environment variable holding the API key")] = None,
    bench_image: Annotated[Optional[str], typer.Option(
        "--bench-image", help="--local: run the short bench_serving from this image (needs --model-dir)")] = None,
    model_dir: Annotated[Optional[str], typer.Option("--model-dir", help="--local: model directory on the node")] = None,
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="--local: Docker engine for the bench")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report (the recap without --local)")] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """The smoke stage on the node: prove its server answers correctly (--local: the one at --url).

    Health, models, a known answer, reasoning on/off, a forced tool call (also streamed), a short
    bench with zero failed requests. Without --local the result is recorded for `gpunode check`.
    """
    _stage_or_local("smoke", path, local, {"--url": url, "--served-name": served_name, "--api-key-env": api_key_env,
                                           "--bench-image": bench_image, "--model-dir": model_dir,
                                           "--docker-url": docker_url},
                    check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    import os

    from gpunode.smoke.command import smoke as run_smoke

    if path is not None:
        _die(2, ["smoke --local proves the server at --url: give no host file"])
    if not url:
        _die(2, ["smoke --local: give the server's --url"])
    api_key = None
    if api_key_env:
        if api_key_env not in os.environ:
            _die(2, [f"--api-key-env: environment variable {api_key_env} is not set"])
        api_key = os.environ[api_key_env]
    runner = None
    for_bench = [option for option, value in (("--model-dir", model_dir), ("--docker-url", docker_url)) if value]
    if for_bench and not bench_image:
        _die(2, [f"{', '.join(for_bench)}: only with --bench-image (the short bench's)"])
    if bench_image:
        if not model_dir:
            _die(2, ["--bench-image needs --model-dir (the tokenizer is read from the model directory)"])
        from gpunode.engine import docker_client
        from gpunode.smoke.bench import DockerBenchRunner

        client = docker_client(docker_url)
        runner = DockerBenchRunner(client, bench_image, model_dir)
    raise typer.Exit(run_smoke(url, served_name or "glm-5", api_key, runner, as_json, sys.stdout))


_with_codes(smoke, STAGE_CODES, "smoke --local")


@app.command()
def diagnose(
    log: Annotated[Optional[str], typer.Argument(help="a server log file, or - for standard input")] = None,
    path: Annotated[Optional[Path], typer.Option("--hosts", help="host file: read the server container's log on the node")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    as_json: Annotated[bool, typer.Option("--json", help='print {"findings": [{"id", "summary", "cause", "fix", "line"}]}')] = False,
) -> None:
    """Name the failures in an SGLang server log: line, cause and fix of each.

    Ordered by where the failure began; the signatures serve uses when a start fails. Lines are
    cut to 4096 characters; of a file longer than 256 MiB, the first 16 and the last 240 MiB are
    read. A FIFO, device, socket or directory is refused, as is a terminal on standard input."""
    from gpunode.serve.diagnose import findings, scan
    from gpunode.serve.logread import LogUnreadable, open_log
    from gpunode.text import one_line

    if host is not None and path is None:
        _die(2, ["--host picks a host of the host file: give it with --hosts"])
    if (log is None) == (path is None):
        _die(2, ["give a log file, - for standard input, or --hosts HOST_FILE for the node's server log"])
    if path is not None:
        found = findings(_server_log(_one_host(path, host)))
    else:
        try:
            with open_log(str(log)) as source:
                found = scan(source.chunks()).findings()
        except LogUnreadable as exc:
            _die(2, [str(exc)])
        if source.note:
            typer.echo(f"note: {one_line(source.note)}", err=True)
    if as_json:
        typer.echo(json.dumps({"findings": [f.as_dict() for f in found]}, indent=2))
    elif not found:
        typer.echo("no failure found in the log")
    for finding in ([] if as_json else found):
        # The log's line as text that drives no terminal: a log may carry escape sequences.
        typer.echo(f"{finding.id}: {finding.summary}\n  line:  {one_line(finding.line)}\n  cause: {finding.cause}\n"
                   f"  fix:   {finding.fix}")
    raise typer.Exit(1 if any(f.id == "unknown" for f in found) else 0)


def _server_log(chosen: Host) -> str:
    """The server container's log on the node, through the SSH forward to its Docker engine."""
    import docker

    from gpunode.engine import EngineUnreachable, docker_client, forward
    from gpunode.serve.spec import CONTAINER_NAME

    try:
        with forward(chosen.container.reach) as fw:
            client = docker_client(fw.docker_url)
            try:
                return str(client.containers.get(CONTAINER_NAME).logs(tail=5000).decode(errors="replace"))
            finally:
                client.close()
    except (EngineUnreachable, docker.errors.DockerException) as exc:
        _die(3, [f"cannot read {CONTAINER_NAME}'s log on {chosen.container.reach.address}: {exc}"])


@image_app.command("build")
def image_build(
    path: HostFileArg,
    local: LocalOpt = False,
    host: Annotated[Optional[str], typer.Option("--host", help="--local: which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option(
        "--docker-url", help="--local: the engine to build on (default: this machine's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="--local: build even if the content tag exists")] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the recap (--local: the build's result) as JSON "
                                                         "on stdout")] = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The image stage on the node: build, verify and record the server image (--local: build here).

    Without --local: built where the host file says (image.build_on), verified, the result recorded
    for `gpunode check`. With --local: built with THIS machine's engine (or --docker-url's) unless
    its content tag exists, nothing else.
    """
    _stage_or_local("image", path, local, {"--host": host, "--docker-url": docker_url, "--force": force},
                    check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    chosen = _one_host(path, host)
    from gpunode.derive import aot_plan
    from gpunode.engine import EngineUnreachable
    from gpunode.image import BuildError, build

    try:
        result = build(chosen.image, docker_url, _err(), force=force, aot=aot_plan(chosen))
    except EngineUnreachable as exc:
        _die(3, [str(exc)])
    except BuildError as exc:
        _die(1, [str(exc)])
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(result), indent=2, default=str))
    else:
        typer.echo(f"{result.tag} ({'built in %.0f s' % result.seconds if result.built else 'present, not rebuilt'})")


_with_codes(image_build, STAGE_CODES, "image build --local")


@image_app.command("verify")
def image_verify(
    tag: Annotated[str, typer.Argument(help="the image tag")],
    path: Annotated[Optional[Path], typer.Option("--hosts", help="host file: check its profile's launch flags")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="engine holding the image")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
) -> None:
    """Check inside the image, without a GPU.

    Pins, the toolchain's CUDA, nvcc (and that it compiles for the GPUs' arch), patches, sm_120
    kernels, the FlashInfer modules built ahead of time (those the host file's profile asks for,
    else those the image records), and the server's flags through sglang's own parser (the host
    file's launch, else the profile of the image's own stack).
    """
    from gpunode.derive import aot_plan, server_launch
    from gpunode.image import VerifyError, verify

    if path is None and host is not None:
        _die(2, ["--host picks a host of the host file: give it with --hosts"])
    chosen = _one_host(path, host) if path else None
    try:
        argv = list(server_launch(chosen).argv) if chosen else _stack_launch_argv(tag, docker_url)
        report = verify(tag, argv, docker_url, aot=aot_plan(chosen) if chosen else None)
    except VerifyError as exc:
        _die(1, [str(exc)])
    if as_json:
        typer.echo(report.to_json())
    else:
        for finding in report.findings:
            typer.echo(f"{'OK  ' if finding.ok else 'FAIL'} {finding.name}: {finding.detail}")
    raise typer.Exit(0 if report.ok else 1)


_with_codes(image_verify, "image verify")


def _stack_launch_argv(tag: str, docker_url: str | None) -> list[str]:
    """The launch of the profile of the image's own stack (its org.gpunode.stack label; an image
    without one is the default stack's), with placeholder values: verify without a host file."""
    import docker

    from gpunode import profiles, stacks
    from gpunode.engine import docker_client
    from gpunode.image.context import LABEL_PREFIX
    from gpunode.image.verify import VerifyError

    try:
        labels = docker_client(docker_url).images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        raise VerifyError(f"no image {tag} on the engine") from None
    except docker.errors.DockerException as exc:
        raise VerifyError(f"the engine cannot be reached: {exc}") from None
    profile = profiles.load(stacks.load(labels.get(f"{LABEL_PREFIX}.stack", stacks.DEFAULT)).profile)
    values = {"model_dir": "/model", "served_name": profile.served_name, "bind": "127.0.0.1", "port": "30000"}
    return list(profiles.resolve(profile, values, {}, {}).argv)


@app.command()
def bench(
    path: HostFileArg,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    levels: Annotated[Optional[str], typer.Option("--levels", help="concurrency list, e.g. 1,10,64,256,1024")] = None,
    input_len: Annotated[Optional[int], typer.Option("--input-len", min=1, help="random-ids input tokens")] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", min=1, help="random-ids output tokens")] = None,
    range_ratio: Annotated[float, typer.Option("--range-ratio", help="bench_serving's --random-range-ratio: 1.0 "
                                               "sends exactly the lengths given, r < 1 draws each from [N*r, N]")] = 1.0,
    ab: Annotated[Optional[str], typer.Option("--ab", help="KEY=V1,V2 (restart the server per value, sweep each), "
                                              "or a ready pair: " + ", ".join(AB_PRESETS_HELP))] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="an earlier results.jsonl to compare with")] = None,
    p2p_json: Annotated[Optional[Path], typer.Option("--p2p-json", help="`gpunode p2p --json` output, for the roofline")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="results folder")] = Path("results"),
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="the node's Docker engine (default: "
                                                      "the node's, over SSH)")] = None,
    router: Annotated[bool, typer.Option("--router", help="measure the fleet through the host file's router; the "
                                         "report adds each worker's requests")] = False,
) -> None:
    """Sweep sglang.bench_serving over concurrency levels against the node's server.

    Writes a report, plots and a comparison; --ab puts backends (or stacks) side by side. The bench runs where the server does: in
    a container from the server's image on the node's engine (over SSH), on the node's network.
    GPU power is sampled through NVML when gpunode runs on the node itself (host file ssh.connection:
    local); elsewhere the report says the node's GPUs were not sampled. --router sends the sweep
    through the fleet's router instead (from the router's node, or the first host's), and reads
    how many requests the router sent each worker from its metrics."""
    try:
        level_list = [int(v) for v in levels.split(",")] if levels is not None else None
    except ValueError:
        level_list = [0]
    if level_list is not None and min(level_list) < 1:  # an empty list is not the default levels
        _die(2, [f"--levels {levels!r}: give whole numbers of 1 or more separated by commas"])
    if router:
        given = [name for name, value in (("--host", host), ("--ab", ab), ("--docker-url", docker_url)) if value]
        if given:
            _die(2, [f"{', '.join(given)}: not with --router (it measures the fleet as it is, through the router)"])
        raise typer.Exit(_bench_router(path, level_list, input_len, output_len, range_ratio, baseline, p2p_json,
                                       out_dir))
    chosen = _one_host(path, host)
    from gpunode.bench.command import AB_PRESETS, profile_defaults
    from gpunode.bench.command import bench as run_bench
    from gpunode.bench.restart import serve_restart
    from gpunode.bench.sampler import UnavailableSampler
    from gpunode.derive import derive
    from gpunode.engine import EngineUnreachable, docker_client, forward
    from gpunode.handoff import HandoffError
    from gpunode.serve.command import probe_address
    from gpunode.serve.stage import node_settings
    from gpunode.smoke.bench import DockerBenchRunner
    from gpunode.stage import Target

    defaults = profile_defaults(chosen.profile_name)
    derived = derive(chosen)
    tag, tp = derived.server_image, derived.tp_size
    api_key = chosen.server.api_key.resolve() if chosen.server.api_key else None
    # The bench container runs on the node's network: it reaches the server where the node does.
    target = f"http://{probe_address(chosen.server.bind)}:{chosen.server.port}"
    on_node = chosen.container.reach.connection == "local"
    sampler = None if on_node else UnavailableSampler(
        f"not sampled: gpunode ran on this machine, not on the node {chosen.container.reach.address} "
        "(run gpunode on the node to sample its GPUs through NVML)")
    ab = AB_PRESETS.get(ab, ab) if ab else ab

    def sweep(engine_url: str) -> int:
        runner = DockerBenchRunner(docker_client(engine_url), tag, str(chosen.model.path), server_url=target)
        settings = node_settings(Target(chosen, derived), engine_url)[0] if ab else {}
        restart = serve_restart(chosen, tag, engine_url, _err(), **settings) if ab else None
        return run_bench(target, chosen.served_name, level_list or defaults[0], input_len or defaults[1],
                         output_len or defaults[2], runner, sampler, restart, ab, baseline, out_dir,
                         api_key=api_key, tp_size=tp, p2p_json=p2p_json, range_ratio=range_ratio)

    try:
        if docker_url:
            raise typer.Exit(sweep(docker_url))
        with forward(chosen.container.reach) as fw:
            code = sweep(fw.docker_url)
    except EngineUnreachable as exc:
        _die(3, [str(exc)])
    except HandoffError as exc:
        _die(4, [f"the bench cannot restart the server: {exc}"])
    raise typer.Exit(code)


def _bench_router(path: Path, levels: list[int] | None, input_len: int | None, output_len: int | None,
                  range_ratio: float, baseline: Path | None, p2p_json: Path | None, out_dir: Path) -> int:
    """`gpunode bench --router`: the sweep through the router, from a node holding the server image
    and the model's tokenizer (the router's own, else the first host's), with the router's
    per-worker request counts read over SSH from its metrics port."""
    from gpunode.bench.command import bench as run_bench
    from gpunode.bench.command import profile_defaults
    from gpunode.bench.sampler import UnavailableSampler
    from gpunode.derive import derive, derive_router
    from gpunode.engine import EngineUnreachable, docker_client, forward
    from gpunode.router.api import RouterUnavailable, read_metrics, worker_requests
    from gpunode.serve.command import probe_address
    from gpunode.smoke.bench import DockerBenchRunner

    hf = _load(path)
    routed = derive_router(hf)
    if hf.router is None or routed is None:
        _die(2, [f"{path}: --router: the host file has no router: section"])
    node = hf.router_host or hf.hosts[0]
    url = (f"http://{probe_address(hf.router.bind)}:{hf.router.port}" if node is hf.router_host else routed.url)
    derived = derive(node)
    defaults = profile_defaults(node.profile_name)
    names = {w.url: f"{w.host} ({w.url})" for w in routed.workers}
    sampler = UnavailableSampler("not sampled: through the router the fleet's GPUs are on several nodes")
    api_key = hf.router.api_key.resolve() if hf.router.api_key else None
    try:
        with forward(routed.reach, (hf.router.metrics_port,)) as metrics, forward(node.container.reach) as fw:
            metrics_url = f"http://127.0.0.1:{metrics.ports[hf.router.metrics_port]}/metrics"

            def workers() -> dict[str, int]:
                counts = worker_requests(read_metrics(metrics_url))
                return {names.get(u, u): counts.get(u, 0) for u in [*names, *sorted(set(counts) - set(names))]}

            runner = DockerBenchRunner(docker_client(fw.docker_url), derived.server_image, str(node.model.path),
                                       server_url=url)
            return run_bench(url, routed.served_name, levels or defaults[0], input_len or defaults[1],
                             output_len or defaults[2], runner, sampler, None, None, baseline, out_dir,
                             api_key=api_key, tp_size=derived.tp_size, p2p_json=p2p_json, range_ratio=range_ratio,
                             workers=workers)
    except EngineUnreachable as exc:
        _die(3, [str(exc)])
    except RouterUnavailable as exc:
        _die(3, [f"the router's metrics: {exc}"])


@lab_app.command("up")
def lab_up() -> None:
    """Bring the lab up (idempotent; needs root)."""
    from gpunode import lab

    try:
        info = lab.up(lambda line: _err().print(f"lab: {line}", markup=False))
    except lab.LabError as exc:
        _die(4, [str(exc)])
    nodes = ", ".join(f"{name} {numbers}" for name, numbers in info.device_nodes.items())
    typer.echo(f"lab is up ({'changed: ' + ', '.join(info.changed) if info.changed else 'no change'}, {info.seconds} s)\n"
               f"  PVE host:  {info.host_container} at {info.ssh_user}@{info.host_ip} (facts: {info.host_facts_root})\n"
               f"  GPU node:  {info.container} at {info.ssh_user}@{info.container_ip} (ssh -i {info.ssh_key})\n"
               f"  devices:   {nodes}\n"
               f"  Proxmox:   fakepve at {info.pve_url} node {info.pve_node}, CA {info.pve_ca}\n"
               + "".join(f"  fleet:     {site.name}: host {site.host.name} at {info.ssh_user}@{site.host.ip}, GPU node "
                         f"{site.gpu.name} at {site.gpu.ip}, fakepve at {site.pve_url}\n" for site in lab.SITES[1:])
               + "  next:      gpunode provision inventory/lab/host.yml (one host), inventory/lab/fleet.yml (the fleet)")


@lab_app.command("down")
def lab_down(
    purge: Annotated[bool, typer.Option("--purge", help="also delete /var/lib/gpunode-lab")] = False,
) -> None:
    """Take the lab down: container, bridge rules, fakepve."""
    from gpunode import lab

    try:
        lab.down(purge, lambda line: _err().print(f"lab: {line}", markup=False))
    except lab.LabError as exc:
        _die(4, [str(exc)])


@lab_app.command("status")
def lab_status() -> None:
    """Print the lab's state as JSON."""
    from gpunode import lab

    typer.echo(json.dumps(lab.status(), indent=2, default=str))


for _command, _key in ((validate, "validate"), (plan, "plan"), (check, "check"), (diagnose, "diagnose"), (bench, "bench"),
                       (lab_up, "lab up / down"), (lab_down, "lab up / down")):
    _with_codes(_command, _key)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
