"""The options several verbs share, declared once (typer's Annotated types)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

AB_PRESETS_HELP = ("attention (--attention-backend flashinfer,triton)",
                   "moe (--moe-runner-backend flashinfer_cutlass,flashinfer_cutedsl)",
                   "stacks (image.stack sglang-0.5.9-cu128,sglang-0.5.23-cu130)")

HostFileArg = Annotated[Path, typer.Argument(help="the host file (YAML)", show_default=False)]
HostOpt = Annotated[Optional[str], typer.Option("--host", help="which host of the host file")]
LocalHostOpt = Annotated[Optional[str], typer.Option("--host", help="--local: which host of the host file")]

CheckOpt = Annotated[bool, typer.Option("--check", help="report what would change; change nothing")]
DiffOpt = Annotated[bool, typer.Option("--diff", help="show file and config differences")]
LimitOpt = Annotated[Optional[str], typer.Option("--limit", help="only these hosts, a comma list of the host file's "
                                                 "names: a host (brings its GPU node along), a GPU node NAME-ctVMID, "
                                                 "router")]
JsonRecapOpt = Annotated[bool, typer.Option("--json", help="print the recap as JSON on stdout")]
VerboseOpt = Annotated[int, typer.Option("-v", count=True, help="more Ansible output in the log")]
VaultOpt = Annotated[Optional[Path], typer.Option("--vault-password-file", help="for {vault: PATH} secrets")]
LocalOpt = Annotated[bool, typer.Option("--local", help="run it on THIS machine instead of the node (see --help)")]
