"""What each SGLang release's launch_server accepts: its parser, dumped from the release by the lab's
dump_sglang_args.py into images/sglang/args/ (host-file validation reads it; the lab's stand-in server
parses launches with it)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from gpunode.ground.paths import IMAGES

ARGS_DIR = IMAGES / "sglang" / "args"  # sglang_<version>_args.json: each release's parser, dumped from it


@dataclass(frozen=True)
class SglangArg:
    """One argument of sglang's launch_server parser, as dumped from it."""

    flags: tuple[str, ...]
    takes_value: bool
    nargs: str | int | None
    type: str | None
    choices: tuple[str, ...] | None


@functools.cache
def sglang_args(version: str) -> dict[str, SglangArg] | None:
    """Option string -> its argument in sglang ``version``'s parser; None for a release not dumped."""
    path = ARGS_DIR / f"sglang_{version.replace('.', '_')}_args.json"
    if not path.is_file():
        return None
    table: dict[str, SglangArg] = {}
    for action in json.loads(path.read_text(encoding="utf-8"))["actions"]:
        choices = action["choices"]
        arg = SglangArg(tuple(action["flags"]), bool(action["takes_value"]), action["nargs"], action["type"],
                        None if choices is None else tuple(str(choice) for choice in choices))
        table.update(dict.fromkeys(arg.flags, arg))
    return table


def argparse_matches(flag: str, table: dict[str, SglangArg]) -> list[str]:
    """The option strings argparse takes ``flag`` for: itself, else each one it begins (argparse
    takes any unique prefix as an abbreviation, and refuses one that begins several as ambiguous)."""
    if flag in table:
        return [flag]
    return sorted(name for name in table if name.startswith(flag))
