"""The options several verbs share, declared once (typer's Annotated types)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

AB_PRESETS_HELP = ("attention (--attention-backend flashinfer,triton)",
                   "moe (--moe-runner-backend flashinfer_cutlass,flashinfer_cutedsl)",
                   "stacks (image.stack sglang-0.5.9-cu128,sglang-0.5.23-cu130)")

HostFileArg = Annotated[Path, typer.Argument(help="the host file (YAML)", show_default=False)]
HostOpt = Annotated[Optional[str], typer.Option("--host", help="which host of the host file (a stage verb: with --local)")]
HostsFileOpt = Annotated[Optional[Path], typer.Option("--hosts", help="a host file, to read its host's settings from")]

CheckOpt = Annotated[bool, typer.Option("--check", help="report what would change; change nothing")]
DiffOpt = Annotated[bool, typer.Option("--diff", help="show file and config differences")]
LimitOpt = Annotated[Optional[str], typer.Option("--limit", help="only these hosts, a comma list of the host file's "
                                                 "names: a host (brings its GPU node along), a GPU node NAME-ctVMID, "
                                                 "router")]
# One --json: the command's result (a stage verb's recap; --local its own report) as one JSON object on stdout.
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as one JSON object on stdout")]
DockerUrlOpt = Annotated[Optional[str], typer.Option("--docker-url", help="the Docker engine (default: with --local "
                                                     "this machine's, DOCKER_HOST; else the node's, over SSH)")]
VerboseOpt = Annotated[int, typer.Option("-v", count=True, help="more Ansible output in the log")]
VaultOpt = Annotated[Optional[Path], typer.Option("--vault-password-file", help="for {vault: PATH} secrets")]
LocalOpt = Annotated[bool, typer.Option("--local", help="run it on THIS machine instead of the node (see --help)")]
RollingOpt = Annotated[Optional[bool], typer.Option(
    "--rolling/--all-at-once", help="with a router: --rolling takes every serving host out of the router, changes it and "
                                    "puts it back, one batch at a time (router.rolling); --all-at-once changes every "
                                    "host together. Neither: rolling only when the change restarts serving servers",
    show_default=False)]
