"""What the verb modules share: the app and its root group (errors as one line, --json errors as one
object), the shared helpers (_die, _err, _load, _one_host, _names, _with_codes)."""


from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

# Typer 0.29 carries its own click (typer._click, pinned with it): its exceptions are what the
# command line raises.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer._click.globals import get_current_context
from typer.core import TyperGroup

from gpunode.cli.options import AB_PRESETS_HELP as AB_PRESETS_HELP
from gpunode.ground.exitcodes import BAD_INPUT, FAILED, INTERRUPTED, OK

if TYPE_CHECKING:
    from rich.console import Console
    from typer._click import Command, Context

    from gpunode.hostfile import Host, HostFile


def _codes(command: str) -> str:
    from gpunode.ground.exitcodes import help_text

    return help_text(command)


EXIT_CODES_HELP = _codes("provision")
STAGE_CODES = "<stage> (host, container, node, image build, p2p, serve, smoke, router)"


def _with_codes(command: Callable[..., None], *keys: str) -> None:
    """Append the exit codes of ``keys`` (gpunode.ground.exitcodes) to a command's help; a second key is
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

    from gpunode.ground.text import one_line

    console = _err()
    for line in lines:
        console.print(Text.assemble(("error:", "red"), " ", one_line(line)))
    if as_json:
        typer.echo(json.dumps({"error": "; ".join(lines), "errors": lines, "exit_code": code}))


class _Gpunode(TyperGroup):
    """The root command. Every way out is an exit code of gpunode.ground.exitcodes: a usage error is one
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
            _report(FAILED, ["aborted"], "--json" in argv)
            return FAILED
        except Exception as exc:
            if "--json" in argv:  # a bug: its traceback follows on stderr, stdout still holds one object
                typer.echo(json.dumps({"error": f"internal error: {type(exc).__name__}: {exc}",
                                       "errors": [f"internal error: {type(exc).__name__}: {exc}"],
                                       "exit_code": FAILED}))
            raise
        return result if isinstance(result, int) else OK


# Without its verbs until their modules are imported: gpunode.cli.app (below) has every one.
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
app.add_typer(image_app, name="image")


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
        raise typer.Exit(OK)


@app.callback()
def _root(show_version: Annotated[bool, typer.Option(
        "--version", help="print gpunode's version and exit", is_eager=True, callback=_version)] = False) -> None:
    pass


def _load(path: Path) -> HostFile:
    from gpunode.derive import plan
    from gpunode.hostfile import HostFileError

    try:
        return plan.load(path)
    except HostFileError as exc:
        _die(BAD_INPUT, exc.problems)


def _one_host(path: Path, name: str | None) -> Host:
    hf = _load(path)
    names = [h.name for h in hf.hosts]
    if name is not None and name not in names:
        what = "an empty name" if not name.strip() else "no such host in the file"
        _die(BAD_INPUT, [f"{path}: --host {name!r}: {what}; name one host with --host ({', '.join(names)})"])
    if name is None and len(names) > 1:
        _die(BAD_INPUT, [f"{path}: name one host with --host ({', '.join(names)})"])
    return hf.hosts[names.index(name) if name is not None else 0]


def _names(option: str, values: list[str], known: Sequence[str], kind: str, where: str = "") -> list[str]:
    """The names a comma-list option gives, each one of ``known``, in order, once. An empty value or
    name is bad input (left out, --tags or --limit would mean every stage or host), and so is an
    unknown one; either message lists the names there are. ``where`` begins the unknown's message."""
    items = [item.strip() for value in values for item in value.split(",")]
    there = f"({kind}s: {', '.join(known)})"
    if not items or "" in items:
        _die(BAD_INPUT, [f"{option} {','.join(values)!r}: an empty {kind} name {there}"])
    unknown = [item for item in dict.fromkeys(items) if item not in known]
    if unknown:
        _die(BAD_INPUT, [f"{where}unknown {kind}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"{there}"])
    return list(dict.fromkeys(items))
