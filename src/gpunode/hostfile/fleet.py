"""Rules across the hosts of one file: names, vmids, hostnames, addresses and ports that gpunode
would make twice, what the router needs of the hosts, and each container's ssh_public_keys file."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from gpunode.ground.text import shown
from gpunode.ground.yamlsource import YamlSource, format_path
from gpunode.hostfile import sshkeys
from gpunode.hostfile.schema import Host, HostFile, Ssh
from gpunode.hostfile.wording import at

ROUTER_NODE = "router"  # the router machine's name in gpunode's inventory (group routers); no host may take it


def reached_at(bind: str, node: str) -> str:
    """Where another machine reaches a server bound to ``bind`` on the machine at ``node``: ``bind``
    itself, or ``node`` when the server binds all (0.0.0.0, ::); an IPv6 literal in brackets, as a
    URL takes it. The one rule for every such address (a host's server, the router)."""
    address = node if ipaddress.ip_address(bind).is_unspecified else bind
    return f"[{address}]" if ":" in address else address


def worker_address(host: Host) -> str:
    """Where the router reaches a host's server: its bind address, or the node's own when it binds all."""
    return reached_at(host.server.bind, str(host.container.reach.address))


def _router_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """What the router needs of the hosts: a host named by ``on``, servers it can reach with its
    one key, one model, and no port taken twice on one node."""
    router = hf.router
    if router is None:
        return []

    problems: list[str] = []
    names = [host.name for host in hf.hosts]
    if isinstance(router.runs_on, str) and router.runs_on not in names:
        problems.append(at(src, ("router", "runs_on"), f"{router.runs_on!r} is not a host of this file ({', '.join(names)})"))
    served = hf.hosts[0].served_name
    for index, host in enumerate(hf.hosts):
        if host.name == ROUTER_NODE:
            problems.append(at(src, ("hosts", index, "name"), f"{host.name!r} is the router's own name in gpunode's inventory: "
                                    "give the host another"))
        if ipaddress.ip_address(host.server.bind).is_loopback:
            problems.append(at(src, ("hosts", index, "server", "bind"), f"{host.server.bind}: the router cannot reach a "
                                    "server on loopback: bind 0.0.0.0 or the node's address (with server.api_key)"))
        bind = ipaddress.ip_address(host.server.bind)
        if bind.is_unspecified and bind.version == 4 and ":" in str(host.container.reach.address):
            # 0.0.0.0 listens on IPv4 only, and an IPv6-only node is reached at its IPv6 address.
            problems.append(at(src, ("hosts", index, "server", "bind"), f"{host.server.bind} listens on IPv4 only, and the "
                                    f"router reaches {host.name}'s node at {host.container.reach.address}: bind '::'"))
        if host.server.api_key != router.api_key:
            problems.append(at(src, ("hosts", index, "server", "api_key"), "the router sends its one key to every worker: "
                                    "give the same secret as router.api_key" if router.api_key else
                                    "the router has no api_key to send: leave server.api_key unset too, or give router.api_key"))
        if host.served_name != served:
            problems.append(at(src, ("hosts", index, "model", "served_name"), f"{host.served_name!r}: the router serves one "
                                    f"model, and hosts[0] serves {served!r}"))
    if len(hf.hosts) > 1 and router.rolling.batch >= len(hf.hosts):
        problems.append(at(src, ("router", "rolling", "batch"), f"{router.rolling.batch} takes every one of the "
                                f"{len(hf.hosts)} hosts out of the router at once: nothing would serve during a change; "
                                f"give at most {len(hf.hosts) - 1}"))
    # The machine it runs on: a host's GPU node, named or at the same address, or one of its own.
    runs_on = router.runs_on
    on_host = hf.router_host or next((host for host in hf.hosts if isinstance(runs_on, Ssh)
                                      and host.container.reach.address == runs_on.address), None)
    if on_host is not None:
        for key in ("port", "metrics_port"):
            if getattr(router, key) == on_host.server.port:
                problems.append(at(src, ("router", key), f"{on_host.server.port} is taken on {on_host.name}'s node by its server"))
            if on_host.monitor is not None:
                service = on_host.monitor.port_owner(getattr(router, key))
                if service is not None:
                    problems.append(at(src, ("router", key), f"{getattr(router, key)} is taken on {on_host.name}'s node "
                                        f"by {service} (its monitor: section)"))
    ssh = runs_on if isinstance(runs_on, Ssh) else on_host.container.reach if on_host is not None else None
    if ssh is not None and ssh.connection == "ssh":
        machine = f"{on_host.name}'s node" if on_host is not None else "the router's machine"
        for key in ("port", "metrics_port"):
            if getattr(router, key) == ssh.port:
                problems.append(at(src, ("router", key), f"{ssh.port} is taken on {machine} by its SSH server"))
    return problems


def _repeats(hf: HostFile, src: YamlSource) -> list[str]:
    """Names and node addresses must be unique across hosts (checked here to name the exact path)."""
    problems: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    for index, host in enumerate(hf.hosts):
        for what, value, path in (
            ("name", host.name, ("hosts", index, "name")),
            ("node address", host.container.reach.address, ("hosts", index, "container")),
        ):
            first = seen.setdefault((what, value), index)
            if first != index:
                problems.append(f"{format_path(path)}: {what} {value!r} repeats hosts[{first}] (line {src.line_of(path)})")
    return problems


def _api_of(url: str) -> tuple[str, int]:
    """One Proxmox API however its URL is written (case, default port, a trailing slash)."""
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.port or 443


def _collisions(hf: HostFile, src: YamlSource) -> list[str]:
    """What gpunode would make twice: a vmid in one Proxmox cluster (one API), a container hostname
    on one node, a container address, a port on one node (its server and its SSH server)."""
    problems: list[str] = []
    vmids: dict[tuple[tuple[str, int], int], int] = {}
    hostnames: dict[tuple[tuple[str, int], str, str], int] = {}
    addresses: dict[str, int] = {}
    for index, host in enumerate(hf.hosts):
        api, ct = _api_of(host.api.url), host.container
        first = vmids.setdefault((api, ct.vmid), index)
        if first != index:
            problems.append(at(src, ("hosts", index, "container", "vmid"), f"vmid {ct.vmid} repeats hosts[{first}]'s "
                                f"on the same Proxmox API {host.api.url} (one vmid per cluster): give another"))
        first = hostnames.setdefault((api, host.api.node, ct.hostname), index)
        if first != index:
            problems.append(at(src, ("hosts", index, "container", "hostname"),
                                f"{shown(ct.hostname, quote=True)} repeats hosts[{first}]'s container on node "
                                f"{host.api.node} of {host.api.url}: give another"))
        for key, address in ct.network.addresses.items():  # IPv4 and IPv6 alike
            first = addresses.setdefault(address, index)
            # The same node address is _repeats' already.
            if first != index and hf.hosts[first].container.reach.address != ct.reach.address:
                problems.append(at(src, ("hosts", index, "container", "network", key),
                                    f"{address} repeats hosts[{first}]'s container address: give another"))
        if ct.reach.connection == "ssh" and host.server.port == ct.reach.port:
            problems.append(at(src, ("hosts", index, "server", "port"), f"{host.server.port} is taken on "
                                f"{host.name}'s node by its SSH server (container.ssh.port)"))
    return problems


def _keys_file_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """Each container's ssh_public_keys file, read and checked as Proxmox will check it
    (gpunode.hostfile.sshkeys). A file that is not on this machine is the container stage's to report,
    before it sends anything: a host file may be validated where its keys are not."""
    problems: list[str] = []
    for index, host in enumerate(hf.hosts):
        path = host.container.ssh_public_keys
        if path is None or not os.path.lexists(path.expanduser()):
            continue
        try:
            sshkeys.load(path.expanduser())
        except sshkeys.KeysFileError as exc:
            problems.append(at(src, ("hosts", index, "container", "ssh_public_keys"), str(exc)))
    return problems

