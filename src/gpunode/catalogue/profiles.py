"""Server profiles: a model's launch flags and environment as data, each with its reason.

A profile is a YAML file under ``gpunode/profiles/``. Profiles for other models are new files,
not new code. The host file may override any flag or variable (``server.flags``/``server.env``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

FlagValue = str | int | float | bool | None
# The placeholders a flag value may hold, filled by name: nothing else in braces is read (a JSON
# value such as '{"a": 1}' stays as written, and no value is ever evaluated).
PLACEHOLDERS = ("model_dir", "served_name", "bind", "port")
# sglang's names of the tensor-parallel size (server_args.py: --tensor-parallel-size, --tp-size).
TP_FLAGS = ("--tp-size", "--tensor-parallel-size")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


class ProfileError(ValueError):
    """A profile that cannot be found or read."""


@dataclass(frozen=True)
class Flag:
    flag: str
    value: FlagValue
    why: str


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model_id: str
    served_name: str
    gpus: int
    arch: str
    stack: str  # the serving stack it runs on (images/sglang/stacks)
    module: str
    flags: tuple[Flag, ...]
    env: tuple[EnvVar, ...]
    # What the checkpoint's config.json must say for this launch (the model stage checks it): its
    # architectures[0] and quantization_config's quant_method and quant_algo. An architecture the
    # stack does not know turns off its sparse-attention set-up (FIELD-NOTES s13).
    architecture: str | None = None
    quantization: tuple[tuple[str, str], ...] = ()

    def flag_value(self, flag: str) -> FlagValue:
        for item in self.flags:
            if item.flag == flag:
                return item.value
        return None


def available() -> list[str]:
    """Names of the profiles shipped with the package."""
    folder = resources.files("gpunode") / "profiles"
    return sorted(entry.name[:-4] for entry in folder.iterdir() if entry.name.endswith(".yml"))


@cache
def load(name: str) -> Profile:
    """Load a shipped profile by name (once: a Profile is frozen, and validate and plan ask often)."""
    if name not in available():
        raise ProfileError(f"unknown profile {name!r} (known: {', '.join(available())})")
    text = (resources.files("gpunode") / "profiles" / f"{name}.yml").read_text(encoding="utf-8")
    raw: dict[str, Any] = yaml.safe_load(text)
    try:
        return Profile(
            name=raw["name"],
            description=raw["description"],
            model_id=raw["model"]["id"],
            served_name=raw["model"]["served_name"],
            gpus=int(raw["gpus"]),
            arch=raw["arch"],
            stack=raw["stack"],
            module=raw["module"],
            flags=tuple(Flag(item["flag"], item.get("value"), item["why"]) for item in raw["flags"]),
            env=tuple(EnvVar(item["name"], str(item["value"]), item["why"]) for item in raw["env"]),
            architecture=raw["model"].get("architecture"),
            quantization=tuple((str(k), str(v)) for k, v in (raw["model"].get("quantization") or {}).items()),
        )
    except (KeyError, TypeError) as exc:
        raise ProfileError(f"profile {name!r} is malformed: missing {exc}") from None


@dataclass(frozen=True)
class Launch:
    """The resolved server launch: argv after the interpreter, and environment."""

    argv: tuple[str, ...]
    env: dict[str, str]
    reasons: dict[str, str]

    def command_line(self, redact: frozenset[str] = frozenset({"--api-key"})) -> str:
        """Shell-quoted command line, with the values of secret flags replaced by ***."""
        out: list[str] = []
        for arg in self.argv:
            flag, sep, _value = arg.partition("=")
            out.append(shlex.quote(f"{flag}=***") if sep and flag in redact else shlex.quote(arg))
        return " ".join(out)

    def value_of(self, *flags: str) -> str | None:
        """The value given to the first of ``flags`` found (``--flag=value``), or None."""
        for arg in self.argv:
            flag, sep, value = arg.partition("=")
            if sep and flag in flags:
                return value
        return None


def flag_arg(flag: str, value: FlagValue) -> str:
    """One argument for a flag and its value: ``--flag=value``, so that a value beginning with ``-``
    is never read as a flag of its own (argparse takes whatever follows ``=``)."""
    return flag if value is None or value is True else f"{flag}={value}"


def fill(value: str, values: Mapping[str, str]) -> str:
    """``value`` with each ``{placeholder}`` of PLACEHOLDERS replaced from ``values``, by name."""
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], value)


def merged_flags(profile: Profile, overrides: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """The profile's flags with the host file's overrides on top, in launch order (an override of
    ``false`` is kept here: ``resolve`` leaves that flag out)."""
    merged: dict[str, FlagValue] = {item.flag: item.value for item in profile.flags}
    merged.update(overrides)
    return merged


def resolve(
    profile: Profile,
    values: dict[str, str],
    flag_overrides: dict[str, FlagValue],
    env_overrides: dict[str, str],
) -> Launch:
    """Apply host-file overrides to a profile and fill its ``{placeholders}`` (PLACEHOLDERS, by name).

    An override of ``false`` removes a switch or flag; ``true``/``null`` makes it a bare switch.
    Flags the profile does not have are appended in the order given. Each flag with a value is one
    argument, ``--flag=value``.
    """
    merged = merged_flags(profile, flag_overrides)
    reasons = {item.flag: item.why for item in profile.flags}
    reasons.update({flag: "set in the host file (server.flags)" for flag in flag_overrides})
    argv: list[str] = ["python3", "-m", profile.module]
    for flag, value in merged.items():
        if value is False:
            continue
        argv.append(flag_arg(flag, fill(value, values) if isinstance(value, str) else value))
    env = {item.name: item.value for item in profile.env}
    for item in profile.env:
        reasons[item.name] = item.why
    for name, value in env_overrides.items():
        env[name] = value
        reasons[name] = "set in the host file (server.env)"
    return Launch(argv=tuple(argv), env=env, reasons=reasons)
