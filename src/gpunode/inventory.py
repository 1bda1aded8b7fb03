"""Turn a validated host file into an Ansible inventory (references to secrets only, never values)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from gpunode.derive import ROUTER_NODE, derive_for, derive_router, node_name, router_reach
from gpunode.hostfile import Host, HostFile, SecretRef, Ssh, read_secret_file


# Secret files by (host name, field): paths only; the values stay in the files.
SecretFiles = dict[tuple[str, str], Path]
# The variables that carry the host file's data into Ansible. Ansible templates every string it is
# given (nested ones too), so a value holding "{{ lookup('pipe', ...) }}" would run on this machine:
# these are written as !unsafe, which Ansible reads as data and never renders.
DATA_VARS = ("gpunode_host", "gpunode_derived", "gpunode_secrets", "gpunode_router")


# Proxmox VE and the GPU container are Debian (the node stage asserts Debian 12): their python3 is
# here, and naming it spares Ansible's discovery of it, a round trip per machine and run.
DEBIAN_PYTHON = "/usr/bin/python3"


def _ssh_vars(ssh: Ssh, debian: bool = False) -> dict[str, Any]:
    if ssh.connection == "local":
        return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hostvars: dict[str, Any] = {
        "ansible_host": ssh.address,
        "ansible_port": ssh.port,
        "ansible_user": ssh.user,
    }
    if debian:
        hostvars["ansible_python_interpreter"] = DEBIAN_PYTHON
    if ssh.key_file is not None:
        hostvars["ansible_ssh_private_key_file"] = str(ssh.key_file.expanduser())
    if ssh.known_hosts is not None:
        # Host keys are checked: a node answering with another key is not our node.
        # Ansible splits this like a shell: the path goes quoted.
        known_hosts = shlex.quote(f"-oUserKnownHostsFile={ssh.known_hosts.expanduser()}")
        hostvars["ansible_ssh_common_args"] = f"{known_hosts} -oStrictHostKeyChecking=yes"
    return hostvars


def _secret_files(host: Host, secrets: SecretFiles) -> dict[str, str | None]:
    """Where this run's stages find each secret the host names: a file the run wrote (or the
    host file's own file), or for ``{vault: PATH}`` the vault file, which Ansible opens itself."""
    def file(field: str) -> str | None:
        return str(secrets[(host.name, field)]) if (host.name, field) in secrets else None

    def vault(ref: SecretRef | None) -> str | None:
        return str(ref.vault.expanduser()) if ref is not None and ref.vault is not None else None

    auth = host.api.auth
    return {"password_file": file("password"), "password_vault": vault(auth.password),
            "token_secret_file": file("token_secret"), "token_secret_vault": vault(auth.token_secret),
            "api_key_file": file("api_key"), "hub_token_file": file("hub_token"),
            "alert_token_file": file("alert_token"), "alert_token_vault": vault(_alert_token(host)),
            "alert_password_file": file("alert_password"), "alert_password_vault": vault(_alert_password(host))}


def _alert_token(host: Host) -> SecretRef | None:
    webhook = host.monitor.alerts.webhook if host.monitor is not None else None
    return webhook.token if webhook is not None else None


def _alert_password(host: Host) -> SecretRef | None:
    email = host.monitor.alerts.email if host.monitor is not None else None
    return email.password if email is not None else None


def host_vars(hostfile: HostFile, host: Host, secrets: SecretFiles) -> dict[str, Any]:
    """The one crossing from Python into Ansible, per host: the validated host as data, the values
    derived from it once (gpunode.derive) and the run's secret files. The Proxmox host and its GPU
    container carry the same three."""
    return {"gpunode_host": host.model_dump(mode="json"), "gpunode_derived": derive_for(hostfile, host).model_dump(mode="json"),
            "gpunode_secrets": _secret_files(host, secrets)}


def build(hostfile: HostFile, secrets: SecretFiles | None = None) -> dict[str, Any]:
    """The inventory: each host under pve_hosts (the Proxmox host, over ``ssh``) and its GPU
    container under gpu_nodes (``container.ssh``), both with host_vars."""
    secrets = secrets or {}
    shared = {host.name: host_vars(hostfile, host, secrets) for host in hostfile.hosts}
    children: dict[str, Any] = {
        "pve_hosts": {"hosts": {host.name: {**_ssh_vars(host.ssh, debian=True), **shared[host.name]}
                                for host in hostfile.hosts}},
        "gpu_nodes": {"hosts": {node_name(host): {**_ssh_vars(host.container.reach, debian=True),
                                                  **shared[host.name]} for host in hostfile.hosts}},
    }
    if hostfile.router is not None:
        children["routers"] = {"hosts": {ROUTER_NODE: {**_ssh_vars(router_reach(hostfile)),
                                                       **router_vars(hostfile, secrets)}}}
    return {
        "all": {
            # API modules run here, with gpunode's own interpreter (they import gpunode).
            "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
            "children": children,
        }
    }


def router_vars(hostfile: HostFile, secrets: SecretFiles) -> dict[str, Any]:
    """The router machine's crossing: the router's settings as data, the values derived for it
    once, and the run's file holding its key."""
    assert hostfile.router is not None
    derived = derive_router(hostfile)
    assert derived is not None
    key = secrets.get((ROUTER_NODE, "api_key"))
    return {"gpunode_router": hostfile.router.model_dump(mode="json"), "gpunode_derived": derived.model_dump(mode="json"),
            "gpunode_secrets": {"api_key_file": str(key) if key else None}}


def limit_pattern(hostfile: HostFile, limit: str | None) -> str | None:
    """``--limit`` in the host file's words: a host's name brings its GPU node along (and the
    router, which must learn of a worker that comes back); anything else is an Ansible pattern."""
    if not limit:
        return limit
    names = {host.name: host for host in hostfile.hosts}
    out: list[str] = []
    for part in (p.strip() for p in limit.split(",")):
        if not part:
            continue
        out.append(part)
        if part in names:
            out.append(node_name(names[part]))
            if hostfile.router is not None:
                out.append(ROUTER_NODE)
    return ",".join(dict.fromkeys(out))


def secret_refs(hostfile: HostFile) -> dict[tuple[str, str], SecretRef]:
    """Every secret the host file names, by (host name, field)."""
    refs: dict[tuple[str, str], SecretRef] = {}
    for host in hostfile.hosts:
        for field, ref in (("password", host.api.auth.password), ("token_secret", host.api.auth.token_secret),
                           ("api_key", host.server.api_key), ("hub_token", host.model.token),
                           ("alert_token", _alert_token(host)), ("alert_password", _alert_password(host))):
            if ref is not None:
                refs[(host.name, field)] = ref
    if hostfile.router is not None and hostfile.router.api_key is not None:
        refs[(ROUTER_NODE, "api_key")] = hostfile.router.api_key
    return refs


def secret_where(hostfile: HostFile, owner: str, field: str) -> str:
    """Which secret of the host file, for a message: ``hosts[1] api_key``, ``router api_key``."""
    if owner == ROUTER_NODE:
        return f"router {field}"
    return f"hosts[{[h.name for h in hostfile.hosts].index(owner)}] {field}"


def secret_env_names(hostfile: HostFile) -> set[str]:
    """Environment variables the host file names as secrets (kept out of Ansible's environment)."""
    return {ref.env for ref in secret_refs(hostfile).values() if ref.env}


def secret_values(secrets: SecretFiles | None) -> tuple[str, ...]:
    """The values of the run's secret files (env secrets in memory, file secrets where they are),
    for the redaction of everything the run shows or keeps."""
    values = []
    for path in (secrets or {}).values():
        try:
            values.append(read_secret_file(path))
        except LookupError:
            continue  # the stage that needs it says so; nothing to hide that could not be read
    return tuple(value for value in values if value)


class _Unsafe(dict):  # type: ignore[type-arg]
    """A mapping to write under YAML's !unsafe tag: Ansible keeps every string in it, however deep, as data."""


def _unsafe(dumper: Any, data: _Unsafe) -> Any:
    return dumper.represent_mapping("!unsafe", dict(data))


def write(hostfile: HostFile, path: Path, secrets: SecretFiles | None = None) -> Path:
    """The inventory as YAML at ``path``, with the host file's data (DATA_VARS) tagged ``!unsafe``:
    Ansible reads it as data, never as a template. The connection variables stay plain: testinfra
    reads them, and their values (addresses, user names, paths without template delimiters, which
    the host file refuses) cannot hold a template."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # each host's data written whole: no anchor reaches across hosts or tags

    Dumper.add_representer(_Unsafe, _unsafe)
    built = build(hostfile, secrets)
    for group in built["all"]["children"].values():
        for hostvars in group["hosts"].values():
            for name in DATA_VARS:
                if name in hostvars:
                    hostvars[name] = _Unsafe(hostvars[name])
    path.write_text(yaml.dump(built, Dumper=Dumper, sort_keys=False, width=1 << 20))
    return path
