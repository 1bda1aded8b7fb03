"""The host file: one YAML document describing Proxmox hosts and their GPU containers.

Validated with pydantic; every problem becomes one line naming the YAML path and line, e.g.
``hosts[0].container.memory_gb: must be > 0 (line 14)``. Unknown keys are errors. Secrets are
never inline: a secret field takes ``{env: NAME}``, ``{file: PATH}`` or ``{vault: PATH}``.

The parts, as sglang's server_args keeps field declarations, choices and cross-field rules apart:
gpunode.hostfile.schema holds the models, .rules the checks of sglang's flags that run after them,
.fleet the rules across hosts (and the router), .wording pydantic's errors as lines; here the host
file is parsed and loaded, every rule run in turn. Each name of those is also one of this package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from gpunode.ground.text import one_line, shown
from gpunode.ground.yamlsource import SourceError, YamlSource, format_path, load_yaml
from gpunode.hostfile import sshkeys
from gpunode.hostfile.fleet import (
    ROUTER_NODE,
    _api_of,
    _collisions,
    _keys_file_problems,
    _repeats,
    _router_problems,
    reached_at,
    worker_address,
)
from gpunode.hostfile.rules import (
    _TP_ONLY,
    _as_written,
    _flag_problems,
    _host_flag_problems,
    _number,
    _parallel_problems,
    _value_problem,
    whole_number,
)
from gpunode.hostfile.schema import (
    _DNS_LABEL,
    _SECRET_ENV,
    _USER_INFO,
    DRIVER_RE,
    ENV_NAME_RE,
    FINGERPRINT_RE,
    GPU_MINOR_MAX,
    HOSTNAME_RE,
    IP4_MIN_PREFIX,
    IP6_MIN_PREFIX,
    IP_NONE,
    MONITOR_PORTS,
    NAME_MAX,
    OWNED_ENV,
    OWNED_FLAGS,
    PATH_MAX,
    PIN_RE,
    SECRET_FILE_MAX,
    SECRET_FLAG_ENDINGS,
    SECRET_REF,
    SHA256_RE,
    USER_RE,
    AlertEmail,
    AlertWebhook,
    ApiAuth,
    Container,
    Driver,
    FlagOverride,
    Host,
    HostFile,
    Image,
    ImagePins,
    Installer,
    Model,
    Monitor,
    MonitorAlerts,
    Network,
    P2pExpect,
    PathValue,
    Prepare,
    ProxmoxApi,
    Rolling,
    Router,
    RouterImage,
    SecretRef,
    Server,
    Ssh,
    Strict,
    Tls,
    _cidr,
    _gateway_of,
    _usable_path,
    address_text,
    base_text,
    exposed_needs_key,
    flag_refusal,
    ip_address_text,
    read_secret_file,
    secret_flag,
    url_text,
    user_name_text,
)
from gpunode.hostfile.wording import (
    _WANTED,
    _YES_NO,
    _file_loc,
    _found,
    _message,
    _model_at,
    _one_per_key,
    _suggest,
    _why_not,
    at,
    problems_from,
)


def _ca_bundle_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """The CA bundles the image tags read on this machine: readable files here."""
    problems: list[str] = []
    bundles = [(("hosts", index, "image", "ca_bundle"), host.image.ca_bundle) for index, host in enumerate(hf.hosts)]
    if hf.router is not None:
        bundles.append((("router", "image", "ca_bundle"), hf.router.image.ca_bundle))
    for path, bundle in bundles:
        if bundle is not None and not (os.path.isfile(bundle) and os.access(bundle, os.R_OK)):
            problems.append(at(src, path, f"{shown(str(bundle), quote=True)} is not a readable file on this machine "
                                "(the image's build context takes it from here)"))
    return problems


class HostFileError(Exception):
    """One or more problems with a host file; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# A rule the floors above add (derive.plan: that a valid file has a plan), given the file and its source.
MoreRules = Callable[["HostFile", YamlSource], list[str]]


def parse(src: YamlSource, more: MoreRules | None = None) -> HostFile:
    if src.problems:
        raise HostFileError([f"{format_path(path)}: {text} (line {line})" for path, text, line in src.problems])
    if not isinstance(src.data, dict):
        raise HostFileError(["(top level): must be a mapping with 'version' and 'hosts' (line 1)"])
    try:
        hf = HostFile.model_validate(src.data)
    except ValidationError as exc:
        raise HostFileError(problems_from(exc, src)) from None
    problems = (_repeats(hf, src) + _router_problems(hf, src) + _collisions(hf, src) + _flag_problems(hf, src)
                + _keys_file_problems(hf, src))
    problems = problems or _ca_bundle_problems(hf, src)
    # The floors above check only a file that passed every rule here.
    problems = problems or (more(hf, src) if more else [])
    if problems:
        raise HostFileError(problems)
    return hf


def load(path: Path, more: MoreRules | None = None) -> HostFile:
    """Load and validate a host file; raise HostFileError listing every problem found."""
    try:
        src = load_yaml(path)
    except SourceError as exc:
        raise HostFileError([str(exc)]) from None
    try:
        return parse(src, more)
    except HostFileError as exc:
        # One line each whatever a rule wrote into it: HostFileError's text joins them with newlines.
        name = shown(str(path), limit=240)
        raise HostFileError([one_line(f"{name}: {problem}") for problem in exc.problems]) from None
