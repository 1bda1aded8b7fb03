"""sglang's own flags in server.flags, read by the parser of the stack's sglang release (its
dump): each a flag sglang takes, by one name, with a value of its type; then the tensor-parallel
and data-parallel sizes against the GPUs the container selects. Rules that run after the models."""

from __future__ import annotations

import difflib
import re

from gpunode.catalogue import profiles
from gpunode.catalogue.sglangargs import SglangArg, argparse_matches, sglang_args
from gpunode.ground.text import shown
from gpunode.ground.yamlsource import YamlSource
from gpunode.hostfile.schema import FlagOverride, Host, HostFile, flag_refusal
from gpunode.hostfile.wording import at

# Without a dump of the release: the tensor-parallel size, under the names every release has.
_TP_ONLY = dict.fromkeys(profiles.TP_FLAGS, SglangArg(profiles.TP_FLAGS, True, None, "int", None))


def whole_number(value: FlagOverride) -> int | None:
    """``value`` as argparse's int() reads it after ``--flag=`` (a YAML integer or digits), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, str) and not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return None
    return int(value)


def _number(value: FlagOverride) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _as_written(value: FlagOverride) -> str:
    """A flag's value as the host file holds it: text in quotes, numbers bare."""
    return shown(value, quote=isinstance(value, str))


def _value_problem(flag: str, arg: SglangArg, value: FlagOverride) -> str | None:
    """Why sglang's parser would refuse ``value`` for ``arg`` (given as ``flag``), or None."""
    if value is False:
        return None  # leaves the flag out
    bare = value is None or value is True
    if not arg.takes_value:
        return None if bare else f"{flag} is a switch: give true, or false to leave it out, not {_as_written(value)}"
    if bare:
        return None if arg.nargs in ("?", "*") else f"{flag} needs a value"
    if arg.nargs is not None:
        return None  # a list: sglang reads the one argument itself
    if arg.type == "int" and whole_number(value) is None:
        return f"{flag} takes a whole number, not {_as_written(value)}"
    if arg.type == "float" and not _number(value):
        return f"{flag} takes a number, not {_as_written(value)}"
    if arg.choices is not None and str(value) not in arg.choices:
        listed = ", ".join(arg.choices[:12]) + (", ..." if len(arg.choices) > 12 else "")
        return f"{flag} takes one of {listed}, not {_as_written(value)}"
    return None


def _flag_problems(hf: HostFile, src: YamlSource) -> list[str]:
    problems: list[str] = []
    for index, host in enumerate(hf.hosts):
        problems += _host_flag_problems(host, index, src)
    return problems


def _host_flag_problems(host: Host, index: int, src: YamlSource) -> list[str]:
    """server.flags read by the parser of the stack's own sglang (its dump): each flag is one that
    sglang takes, by one name (the profile's where the profile sets it), none gpunode sets itself
    or that carries a secret, each value of its type; then the tensor-parallel size is a whole
    number >= 1 equal to the GPUs the server is given (data parallel only within them)."""
    flags_path: tuple[str | int, ...] = ("hosts", index, "server", "flags")
    profile = profiles.load(host.profile_name)
    version = host.image.pinned().get("sglang", "")
    dumped = sglang_args(version)
    table = dumped if dumped is not None else _TP_ONLY
    release = f"sglang {version} (stack {host.image.stack})"
    spelled = {table[item.flag]: item.flag for item in profile.flags if item.flag in table}
    given: dict[SglangArg, str] = {}
    problems: list[str] = []
    for flag, value in host.server.flags.items():
        path = flags_path + (flag,)
        matches = argparse_matches(flag, table)
        if not matches:
            if dumped is not None:
                close = difflib.get_close_matches(flag, list(table), n=1)
                problems.append(at(src, path, f"{flag} is not a flag of {release}"
                                    + (f" (did you mean {close[0]}?)" if close else "")))
            continue
        if len(matches) > 1:
            listed = ", ".join(matches[:6]) + (", ..." if len(matches) > 6 else "")
            problems.append(at(src, path, f"{flag} is ambiguous in {release}: it begins {listed}: "
                                "write the flag in full"))
            continue
        name, arg = matches[0], table[matches[0]]
        named = flag if name == flag else f"{flag} abbreviates {name}, which"
        if (refusal := flag_refusal(arg.flags)) is not None:
            problems.append(at(src, path, f"{named} {refusal}"))
        elif arg in given:
            problems.append(at(src, path, f"{flag} is {given[arg]} again, by another name: give it once"))
        elif arg in spelled and spelled[arg] != flag:
            problems.append(at(src, path, f"{flag} is {spelled[arg]} by another name, which profile {profile.name} "
                                f"sets: write {spelled[arg]}, so that this value replaces the profile's instead of "
                                "both reaching sglang"))
        elif profiles.TP_FLAGS[0] in arg.flags and flag not in profiles.TP_FLAGS:
            # derive reads the size by these names (profiles.TP_FLAGS) for the checks and the bench.
            problems.append(at(src, path, f"{flag} abbreviates {name}: write {' or '.join(profiles.TP_FLAGS)} in "
                                "full"))
        elif (why := _value_problem(flag, arg, value)) is not None:
            problems.append(at(src, path, why))
        given.setdefault(arg, flag)
    return problems or _parallel_problems(host, index, src, table, profile)


def _parallel_problems(host: Host, index: int, src: YamlSource, table: dict[str, SglangArg],
                       profile: profiles.Profile) -> list[str]:
    """The tensor-parallel size the launch gives (the host file's, else the profile's, else sglang's
    1) is a whole number >= 1 and the number of GPUs selected: the server is given all of them."""
    launched: dict[SglangArg, tuple[FlagOverride, str]] = {}  # false included: the flag left out
    for flag, value in profiles.merged_flags(profile, host.server.flags).items():
        matches = argparse_matches(flag, table)
        if len(matches) == 1:
            launched[table[matches[0]]] = (value, flag)

    def where(flag: str | None, otherwise: tuple[str | int, ...]) -> tuple[str | int, ...]:
        return ("hosts", index, "server", "flags", flag) if flag in host.server.flags else otherwise

    gpus_path: tuple[str | int, ...] = ("hosts", index, "container", "gpus")
    tp_value, tp_flag = launched.get(table[profiles.TP_FLAGS[0]], (1, None))
    tp = 1 if tp_value is False else whole_number(tp_value)
    if tp is None or tp < 1:
        return [at(src, where(tp_flag, gpus_path), f"{tp_flag} {_as_written(tp_value)}: the tensor-parallel size is "
                    "a whole number >= 1, the GPUs the server shards the model over")]
    named = (f"server {tp_flag} {tp}" if tp_value is not False and tp_flag else
             f"server {tp_flag}: false (sglang's default tensor-parallel size, 1)" if tp_flag else
             "sglang's default tensor-parallel size 1")
    if tp_flag and tp_flag not in host.server.flags:
        named += f" (profile {profile.name})"
    gpus = host.container.gpus
    if isinstance(gpus, list) and tp != len(gpus):
        return [at(src, where(tp_flag, gpus_path), f"{named} needs {tp} GPUs but container.gpus selects {len(gpus)}: "
                    "make them equal (the server is given every GPU selected)")]
    dp_arg = table.get("--dp-size")
    if dp_arg is None or dp_arg not in launched:
        return []
    dp_value, dp_flag = launched[dp_arg]
    if dp_value is False:
        return []
    dp_path = where(dp_flag, ("hosts", index, "server", "profile"))
    dp = whole_number(dp_value)
    if dp is None or dp < 1:
        return [at(src, dp_path, f"{dp_flag} {_as_written(dp_value)}: the data-parallel size is a whole number >= 1")]
    dp_attention = any("--enable-dp-attention" in arg.flags and value is not False
                       for arg, (value, _) in launched.items())
    if dp > 1 and not dp_attention:
        return [at(src, dp_path, f"{dp_flag} {dp} runs {dp} copies of the model, {dp} x {tp} GPUs, but gpunode gives "
                    "one server one tensor-parallel group: leave it 1, or add --enable-dp-attention (its DP ranks "
                    "share the TP GPUs)")]
    if dp > 1 and tp % dp:
        return [at(src, dp_path, f"{dp_flag} {dp} must divide the tensor-parallel size {tp} with "
                    "--enable-dp-attention")]
    return []
