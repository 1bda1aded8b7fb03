"""`gpunode plan --live`: read (never write) the Proxmox API to say whose container the host
file's vmid is. plan stays contact-free without --live."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from gpunode.hostfile import Host
from gpunode.container import lxc
from gpunode.container.client import Connection, PveClient


@dataclass(frozen=True)
class Ownership:
    vmid: int
    owner: Literal["free", "gpunode", "foreign"]
    detail: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def connection(host: Host) -> Connection:
    """The API connection a run would use; LookupError names a secret that cannot be read here."""
    auth, tls = host.api.auth, host.api.tls
    password = auth.password.resolve() if auth.password is not None else None
    token_secret = auth.token_secret.resolve() if auth.token_secret is not None else None
    return Connection(url=host.api.url, node=host.api.node, method=auth.method, user=auth.user, password=password,
                      token_id=auth.token_id, token_secret=token_secret, verify=tls.verify,
                      ca_file=str(tls.ca_file.expanduser()) if tls.ca_file else None, fingerprint=tls.fingerprint)


def ownership(client: PveClient, node: str, vmid: int) -> Ownership:
    """Free, gpunode's, or someone else's; reads only."""
    ct = lxc.Converger(client, node, vmid)
    if not ct.exists():
        return Ownership(vmid, "free", f"container {vmid} does not exist: provision will create it")
    config = ct.config()
    if lxc.owned(config):
        return Ownership(vmid, "gpunode", f"container {vmid} (hostname {config.get('hostname', '?')}) is gpunode's: "
                                          f"{lxc.first_line(config.get('description'))}")
    return Ownership(vmid, "foreign", lxc.foreign_message(vmid, config, ct.status(), refused=False))


def inspect(host: Host) -> Ownership:
    return ownership(PveClient(connection(host)), host.api.node, host.container.vmid)
