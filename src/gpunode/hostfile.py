"""The host file: one YAML document describing Proxmox hosts and their GPU containers.

Validated with pydantic; every problem becomes one line naming the YAML path and line, e.g.
``hosts[0].container.memory_gb: must be > 0 (line 14)``. Unknown keys are errors. Secrets are
never inline: a secret field takes ``{env: NAME}``, ``{file: PATH}`` or ``{vault: PATH}``.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpunode import profiles, regularfile, sshkeys
from gpunode.nvidia import MIN_DRIVER_SM120, MINORS, UVM_NODES
from gpunode.paths import PACKAGE
from gpunode import stacks
from gpunode.text import one_line, shown
from gpunode.yamlsource import SourceError, YamlSource, format_path, load_yaml

HOSTNAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
DRIVER_RE = r"^\d{3}\.\d{1,3}(\.\d{1,3})?$"
SHA256_RE = r"^[0-9a-f]{64}$"
FINGERPRINT_RE = r"^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$"
PIN_RE = r"^\d+(\.\d+)*$"
USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"  # a login name (useradd's rule): nothing that can start an option
_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# A URL with user information (scheme://user@ or scheme://user:password@), anywhere in a value.
# The lookbehind starts a scheme only where one can begin: without it a long run of letters is
# tried from every position (quadratic; a 100 kB flag value took 10 s).
_USER_INFO = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s]*@")
# /dev/nvidiaN minors: 0-247 are GPUs (NV_MINOR_DEVICE_NUMBER_REGULAR_MAX, the driver's
# nv-chardev-numbers.h); 248-253 are unused, 254 and 255 are nvidia-modeset and nvidiactl (MINORS).
GPU_MINOR_MAX = 247
# Environment names that hold a secret: never inline, since plan prints server.env and docker
# inspect shows it.
_SECRET_ENV = re.compile(r"(^|_)(TOKEN|KEY)$|PASSWORD|SECRET")
SECRET_FLAG_ENDINGS = ("-key", "-token", "-password", "-secret")
SECRET_REF = "{env: NAME}, {file: PATH} or {vault: PATH}"
# Flags gpunode sets from the host file's own keys: given in server.flags too, sglang would take
# whichever came last, and plan would show the other.
OWNED_FLAGS = {"--model-path": "model.path", "--model": "model.path", "--served-model-name": "model.served_name",
               "--host": "server.bind", "--port": "server.port"}
# Variables that would change which GPUs the server sees.
OWNED_ENV = {"CUDA_VISIBLE_DEVICES": "container.gpus", "NVIDIA_VISIBLE_DEVICES": "container.gpus"}


def address_text(value: str) -> str:
    """An IP address (v4 or v6) or a DNS name by RFC 1123: never text ssh could read as an option."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.split(".")
    # A last label of digits only is a mistyped IPv4 address, not a name.
    if len(value) > 253 or not all(_DNS_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"{shown(value, quote=True)} is not an IP address or a DNS name (RFC 1123: dot-separated "
                         "labels of letters, digits and '-', none starting or ending with '-', <= 63 characters "
                         "each, <= 253 in all)")
    return value


def user_name_text(value: str) -> str:
    """A login name: lower case letters, digits, '_' and '-', starting with a letter or '_', <= 32."""
    if not re.fullmatch(USER_RE, value):
        raise ValueError(f"{shown(value, quote=True)} is not a user name (letters a-z, digits, '_' and '-', "
                         "starting with a letter or '_', <= 32 characters)")
    return value


def url_text(value: str, credentials: str) -> str:
    """A URL without user information, whose host is an address (``address_text``). The message
    never repeats a URL that holds credentials; ``credentials`` says where they go instead."""
    parts = urlsplit(value)
    if "@" in parts.netloc:
        raise ValueError(f"the URL carries user information (user@ or user:password@), never inline: {credentials}")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"{shown(value, quote=True)} has a port outside 0-65535") from None
    # The host as written (urlsplit's hostname is lower-cased), without port or IPv6 brackets.
    host = parts.netloc.rpartition(":")[0] if parts.port is not None or parts.netloc.endswith(":") else parts.netloc
    address_text(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    return value


def base_text(value: str) -> str:
    """An image base of images/sglang/bases.yml, optionally behind a registry mirror, which is an
    address and carries no credentials (the message never repeats them)."""
    from gpunode.image import bases

    head, slash, _ = value.partition("/")
    if slash and "@" in head:
        raise ValueError("the registry carries user information (user@ or user:password@), never inline: log the "
                         "engine in to the registry (docker login) instead")
    try:
        ref = bases.parse(value)
    except bases.BaseRefError as exc:
        raise ValueError(str(exc)) from None
    if ref.registry is not None:
        address_text(urlsplit(f"//{ref.registry}").hostname or "")
    return value


def secret_flag(names: tuple[str, ...]) -> bool:
    return any(name.endswith(SECRET_FLAG_ENDINGS) for name in names)


def flag_refusal(names: tuple[str, ...]) -> str | None:
    """Why a flag (one argument's option strings) is not the host file's to give, with the key to
    use instead; None if it is."""
    for name in names:
        if name in OWNED_FLAGS:
            return f"is set by {OWNED_FLAGS[name]}, not server.flags"
    if "--config" in names:
        return "reads sglang's flags from a file, past every check here: give each flag under server.flags"
    if secret_flag(names):
        return (f"carries a secret, never inline (plan prints server.flags): server.flags takes no secret "
                f"reference; the server's key is server.api_key ({SECRET_REF})")
    return None


class Strict(BaseModel):
    """Base for every section: unknown keys are errors, values are immutable once loaded, and
    types are strict: a whole number is a YAML integer (not true, "8" or 8.0), true/false is a
    YAML boolean (not "yes" or 1), a string is a YAML string (not 123)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


PATH_MAX = 4096  # Linux's PATH_MAX and NAME_MAX: a longer path cannot even be looked at
NAME_MAX = 255


def _usable_path(value: Path) -> Path:
    text = str(value)
    if len(text.encode("utf-8", "surrogatepass")) > PATH_MAX:
        raise ValueError(f"a path of {len(text)} characters: Linux takes at most {PATH_MAX} bytes")
    for part in value.parts:
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise ValueError(f"a path with a name of {len(part)} characters ({shown(part, limit=40)}): Linux takes "
                             f"at most {NAME_MAX} bytes")
    return value


# A path is written as a YAML string (the one type strict mode would refuse from one), and is one
# that the system can look at (is_file() raises on a longer one).
PathValue = Annotated[Path, Field(strict=False), AfterValidator(_usable_path)]


class SecretRef(Strict):
    """Where a secret comes from. Exactly one of env, file, vault; never the value itself."""

    env: Annotated[str, Field(pattern=ENV_NAME_RE)] | None = None
    file: PathValue | None = None
    vault: PathValue | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_inline(cls, data: Any) -> Any:
        # The message must not echo the value: it is a secret someone just typed in.
        if not isinstance(data, dict):
            raise ValueError("secrets are never inline: give {env: NAME}, {file: PATH} or {vault: PATH}")
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        given = [name for name in ("env", "file", "vault") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of env, file or vault")
        return self

    def describe(self) -> str:
        if self.env:
            return f"env:{self.env}"
        if self.file:
            return f"file:{self.file}"
        return f"vault:{self.vault}"

    def resolve(self) -> str:
        """Read the secret's value (at run time only; plan never calls this)."""
        if self.env is not None:
            if self.env not in os.environ:
                raise LookupError(f"environment variable {self.env} is not set")
            return os.environ[self.env]
        if self.file is not None:
            return read_secret_file(self.file.expanduser())
        raise LookupError("vault secrets are decrypted by ansible-vault at run time")


SECRET_FILE_MAX = 64 * 1024  # a password, token or key; anything longer is not a secret file


def read_secret_file(path: Path) -> str:
    """A secret file's value: a regular file (never a FIFO that would block, a device, a folder), at
    most SECRET_FILE_MAX bytes of UTF-8; any other is a LookupError of one line."""
    try:
        data = regularfile.read_bytes(path, SECRET_FILE_MAX)
    except regularfile.NotReadable as exc:
        raise LookupError(f"secret file {path}: {exc.why}" + (": not a secret" if exc.too_long else "")) from None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise LookupError(f"secret file {path}: not UTF-8 text") from None


class Ssh(Strict):
    address: str
    connection: Literal["ssh", "local"] = "ssh"  # local: gpunode runs on that machine itself
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: str = "root"
    key_file: PathValue | None = None
    known_hosts: PathValue | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return address_text(value)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return user_name_text(value)


class Tls(Strict):
    verify: bool = True
    ca_file: PathValue | None = None
    fingerprint: Annotated[str, Field(pattern=FINGERPRINT_RE)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Tls:
        if not self.verify and (self.ca_file or self.fingerprint):
            raise ValueError("verify is false but ca_file/fingerprint is set: choose one")
        return self


class ApiAuth(Strict):
    method: Literal["password", "token", "local"]
    user: str = "root@pam"
    password: SecretRef | None = None
    token_id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9._-]*$")] | None = None
    token_secret: SecretRef | None = None

    @model_validator(mode="after")
    def _complete(self) -> ApiAuth:
        if self.method == "password" and self.password is None:
            raise ValueError("method password needs a password: {env: NAME}, {file: PATH} or {vault: PATH}")
        if self.method == "token" and (self.token_id is None or self.token_secret is None):
            raise ValueError("method token needs token_id and token_secret")
        if self.method != "password" and self.password is not None:
            raise ValueError(f"password is only used with method password, not {self.method}")
        if "@" not in self.user:
            raise ValueError(f"user {shown(self.user, quote=True)} needs a realm, e.g. root@pam")
        return self


class ProxmoxApi(Strict):
    url: Annotated[str, Field(pattern=r"^https://[^/\s]+(:\d+)?/?$")]
    node: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")]
    auth: ApiAuth
    tls: Tls = Tls()
    timeout_s: Annotated[int, Field(gt=0, le=3600)] = 300

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return url_text(value, "give the user as api.auth.user and the password as api.auth.password")


# Proxmox's net0 address keys (pve-container src/PVE/LXC/Config.pm, the net format, lines 888-914):
# ip is pve-ipv4-config and gw ipv4; ip6 is pve-ipv6-config and gw6 ipv6 (pve-common
# src/PVE/JSONSchema.pm: pve_verify_ipv4_config line 624, pve_verify_ipv6_config line 636, their
# prefixes checked by pve_verify_cidrv4 line 598 and pve_verify_cidrv6 line 585: 8 to 32 and 8 to
# 128). Proxmox's manual (up, unconfigured) is left out: gpunode's node needs an address.
IP4_MIN_PREFIX, IP6_MIN_PREFIX = 8, 8
IP_NONE = "none"  # no IPv4 at all: ip= is left out of net0 (an IPv6-only container)


def _cidr(value: str, version: int, key: str, example: str, forms: str) -> str:
    """An address with its prefix, of IP ``version``, as Proxmox's CIDRv4/CIDRv6 formats take it;
    ``forms`` says what else ``key`` takes, for a value that is no address."""
    other = {4: ("ip6", 6), 6: ("ip", 4)}[version]
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        iface = None
    if iface is not None and iface.version != version:
        raise ValueError(f"{shown(value, quote=True)} is an IPv{other[1]} address: give it as {other[0]} (Proxmox's "
                         f"{key} is IPv{version} only)")
    if iface is None or "%" in value:  # Python takes a zone (fe80::1%eth0); Proxmox's IPV6RE does not
        raise ValueError(f"{shown(value, quote=True)} is not {forms}")
    if "/" not in value:
        raise ValueError(f"{shown(value, quote=True)} needs a prefix length, e.g. {shown(value)}/{example.split('/')[1]}")
    # Proxmox takes these, but no node can be reached there. (Loopback stays: the suite keeps all
    # its traffic on this machine with it.)
    for test, what in (("is_multicast", "a multicast"), ("is_unspecified", "an unspecified")):
        if getattr(iface.ip, test):
            raise ValueError(f"{shown(value, quote=True)} is {what} address, not one the container can be reached at")
    low, high = (IP4_MIN_PREFIX, 32) if version == 4 else (IP6_MIN_PREFIX, 128)
    if not low <= iface.network.prefixlen <= high:
        raise ValueError(f"{shown(value, quote=True)}: Proxmox takes a prefix length of {low} to {high}")
    return str(iface)


def _gateway_of(value: str, version: int, key: str) -> str:
    """A gateway of IP ``version``, as Proxmox's ipv4/ipv6 formats (``key``: gw, gw6) take it."""
    other = {4: "gateway6", 6: "gateway"}[version]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{shown(value, quote=True)} is not an IP address") from None
    if address.version != version:
        raise ValueError(f"{shown(value, quote=True)} is an IPv{address.version} address: give it as {other} "
                         f"(Proxmox's {key} is IPv{version} only)")
    if "%" in value:
        raise ValueError(f"{shown(value, quote=True)} has a zone: Proxmox's {key} is a plain address")
    return str(address)


class Network(Strict):
    bridge: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")] = "vmbr0"
    ip: str = "dhcp"  # IPv4: an address with prefix, dhcp, or none (IPv6 only)
    gateway: str | None = None  # IPv4, inside ip's network
    ip6: str | None = None  # IPv6: an address with prefix, auto (SLAAC) or dhcp (DHCPv6)
    gateway6: str | None = None  # IPv6, inside ip6's network or link-local (a router's fe80::)
    vlan: Annotated[int, Field(ge=1, le=4094)] | None = None

    @field_validator("ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        if value in ("dhcp", IP_NONE):
            return value
        return _cidr(value, 4, "ip", "192.0.2.20/24",
                     f"'dhcp' or an address with prefix like 192.0.2.20/24 (or '{IP_NONE}': no IPv4, with ip6)")

    @field_validator("ip6")
    @classmethod
    def _ip6(cls, value: str | None) -> str | None:
        if value is None or value in ("auto", "dhcp"):
            return value
        return _cidr(value, 6, "ip6", "2001:db8::20/64",
                     "'auto' (SLAAC), 'dhcp' (DHCPv6) or an IPv6 address with prefix like 2001:db8::20/64")

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: str | None) -> str | None:
        return value if value is None else _gateway_of(value, 4, "gw")

    @field_validator("gateway6")
    @classmethod
    def _gateway6(cls, value: str | None) -> str | None:
        return value if value is None else _gateway_of(value, 6, "gw6")

    @model_validator(mode="after")
    def _gateway_in_subnet(self) -> Network:
        if self.ip == "dhcp":
            if self.gateway is not None:
                raise ValueError("gateway is set but ip is dhcp")
        elif self.ip == IP_NONE:
            if self.ip6 is None:
                raise ValueError(f"ip is {IP_NONE} and no ip6 is given: the container would have no address")
            if self.gateway is not None:
                raise ValueError(f"gateway is set but ip is {IP_NONE}")
        elif self.gateway and ipaddress.ip_address(self.gateway) not in ipaddress.ip_interface(self.ip).network:
            raise ValueError(f"gateway {self.gateway} is outside {ipaddress.ip_interface(self.ip).network}")
        elif self.gateway and ipaddress.ip_address(self.gateway) == ipaddress.ip_interface(self.ip).ip:
            raise ValueError(f"gateway {self.gateway} is the container's own address (ip)")
        if self.gateway6 is None:
            return self
        if self.ip6 is None:
            raise ValueError("gateway6 is set but ip6 is not")
        if self.ip6 in ("auto", "dhcp"):
            raise ValueError(f"gateway6 is set but ip6 is {self.ip6}: the router's advertisements give the route")
        gateway6, network6 = ipaddress.IPv6Address(self.gateway6), ipaddress.IPv6Interface(self.ip6).network
        if gateway6 == ipaddress.IPv6Interface(self.ip6).ip:
            raise ValueError(f"gateway6 {self.gateway6} is the container's own address (ip6)")
        if gateway6 not in network6 and not gateway6.is_link_local:
            raise ValueError(f"gateway6 {self.gateway6} is outside {network6} (and not link-local, fe80::/10)")
        return self

    @property
    def addresses(self) -> dict[str, str]:
        """The container's static addresses by key (ip, ip6): what is known before it starts."""
        return {key: str(ipaddress.ip_interface(value).ip) for key, value in (("ip", self.ip), ("ip6", self.ip6))
                if value is not None and "/" in value}

    @property
    def address(self) -> str | None:
        """The node's address for SSH: the static IPv4 one, else the static IPv6 one (a literal
        without brackets: ssh and Ansible's ansible_host take it so)."""
        return next(iter(self.addresses.values()), None)

    def describe(self) -> str:
        """ip and ip6 as the host file gives them, for a message."""
        return f"ip is {self.ip}" + (f" and ip6 is {self.ip6}" if self.ip6 is not None else "")


class Container(Strict):
    vmid: Annotated[int, Field(ge=100, le=999_999_999)]
    hostname: Annotated[str, Field(pattern=HOSTNAME_RE)]
    template: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+:vztmpl/\S+\.tar\.(gz|xz|zst)$")]
    storage: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    disk_gb: Annotated[int, Field(gt=0)]
    cores: Annotated[int, Field(gt=0, le=8192)]
    memory_gb: Annotated[int, Field(gt=0)]
    swap_mb: Annotated[int, Field(ge=0)] = 0
    unprivileged: bool = False
    onboot: bool = True
    network: Network = Network()
    gpus: Literal["all"] | list[Annotated[int, Field(ge=0, le=255)]] = "all"
    mig: bool = False
    # How the container and Docker get the driver: host-driver shares the host's own user space
    # (a read-only tree at /usr/local/nvidia, then a CDI spec or the same list by hand: nothing
    # from NVIDIA to download, nothing that can drift from the kernel module); nvidia-runtime
    # installs NVIDIA's user space (.run) and nvidia-container-toolkit in the container instead.
    gpu_handoff: Literal["host-driver", "nvidia-runtime"] = "host-driver"
    ssh: Ssh | None = None
    ssh_public_keys: PathValue | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("select at least one GPU, or 'all'")
            if len(set(value)) != len(value):
                raise ValueError("lists a GPU twice")
            control = {minor: path for path, minor in MINORS.items() if path not in UVM_NODES}
            for minor in value:
                if minor in control:
                    raise ValueError(f"{minor} is the minor of {control[minor]}, not of a GPU "
                                     f"(GPUs are 0-{GPU_MINOR_MAX})")
                if minor > GPU_MINOR_MAX:
                    raise ValueError(f"{minor} is beyond the driver's GPU minors (0-{GPU_MINOR_MAX})")
        return value

    @property
    def reach(self) -> Ssh:
        """How Ansible reaches the inside of the container."""
        if self.ssh is not None:
            return self.ssh
        assert self.network.address is not None  # enforced by Host._container_reachable
        return Ssh(address=self.network.address)


class Installer(Strict):
    url: Annotated[str, Field(pattern=r"^https://\S+\.run$")] | None = None
    sha256: Annotated[str, Field(pattern=SHA256_RE)] | None = None
    local_file: PathValue | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return value if value is None else url_text(value, "a download URL takes none (or give local_file)")

    @model_validator(mode="after")
    def _source(self) -> Installer:
        if self.url and self.local_file:
            raise ValueError("give url or local_file, not both")
        if self.url and not self.sha256:
            raise ValueError("an installer url needs its sha256")
        return self


class Driver(Strict):
    version: Annotated[str, Field(pattern=DRIVER_RE)]
    open_module: bool = True
    installer: Installer = Installer()

    @field_validator("version")
    @classmethod
    def _recent(cls, value: str) -> str:
        if int(value.split(".")[0]) < MIN_DRIVER_SM120:
            raise ValueError(f"{value} is older than {MIN_DRIVER_SM120}: Blackwell (SM120) needs >= {MIN_DRIVER_SM120}")
        return value

    @field_validator("open_module")
    @classmethod
    def _open(cls, value: bool) -> bool:
        if not value:
            raise ValueError("Blackwell GPUs need NVIDIA's open kernel module: set true")
        return value


class Prepare(Strict):
    """Changes the host stage may make on the Proxmox host."""

    disable_hmm: bool = True
    release_vfio: bool = True
    persistenced: bool = True
    allow_module_reload: bool = False
    allow_reboot: bool = False
    # Pin (proxmox-boot-tool kernel pin) the newest kernel the NVIDIA module is built for when the
    # one that would boot next has none (its DKMS build failed): the GPUs survive the next reboot.
    pin_kernel: bool = False


class ImagePins(Strict):
    """Pins the host file asserts on top of its stack's (unset: the stack's own, stack.yml). The
    build refuses a lock that does not hold them: a different pin is a new lock, or a new stack."""

    cuda: Annotated[str, Field(pattern=PIN_RE)] | None = None
    torch: Annotated[str, Field(pattern=PIN_RE)] | None = None
    sglang: Annotated[str, Field(pattern=PIN_RE)] | None = None
    flashinfer: Annotated[str, Field(pattern=PIN_RE)] | None = None
    sgl_kernel: Annotated[str, Field(pattern=PIN_RE)] | None = None
    deep_gemm: Annotated[str, Field(pattern=r"^\d+(\.\d+)*(\.post\d+)?$")] | None = None
    transformers: Annotated[str, Field(pattern=PIN_RE)] | None = None

    @field_validator("cuda")
    @classmethod
    def _cuda_sm120(cls, value: str | None) -> str | None:
        if value is not None and tuple(int(p) for p in value.split(".")[:2]) < (12, 8):
            raise ValueError(f"CUDA {value} cannot build for SM120: needs >= 12.8")
        return value

    @field_validator("transformers")
    @classmethod
    def _glm5_config(cls, value: str | None) -> str | None:
        if value is not None and tuple(int(p) for p in value.split(".")[:2]) < (5, 2):
            raise ValueError(f"transformers {value} cannot read GLM-5's config (glm_moe_dsa): needs >= 5.2")
        return value


class Image(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")] = "gpunode/sglang"
    # The serving stack (a folder of images/sglang/stacks): its pins, lock, patches and toolchain.
    # The default is the seeds' stack, which the seeds proved on the hardware.
    stack: str = stacks.DEFAULT
    # A base of images/sglang/bases.yml, optionally behind a registry mirror and pinned by digest;
    # unset: the stack's (stack.yml). The seeds' carries CUDA 12.8's nvcc for FlashInfer's SM120 kernels.
    base: str | None = None
    # base: the stack's own CUDA toolchain if it brings one, else the base's (none for debootstrap);
    # pypi-cuda-13.0: the lab's stand-in.
    toolchain: Literal["base", "pypi-cuda-13.0"] = "base"
    # The GPUs the image is built for: FlashInfer's kernels are compiled ahead of time for their arch.
    gpu_model: Literal["RTX PRO 6000 Blackwell", "RTX 5090", "B200", "H200", "H100"] = "RTX PRO 6000 Blackwell"
    # profile: compile the FlashInfer modules the server profile's launch uses at image build;
    # none: leave them to FlashInfer's JIT at the first request; a list: those of the profile's only.
    flashinfer_aot: Literal["profile", "none"] | list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]] = "profile"
    build_on: Literal["node", "local"] = "node"
    ca_bundle: PathValue | None = None
    pins: ImagePins = ImagePins()
    # Lab only: the serve and smoke stages run the fake SGLang server's image (gpunode.lab.image),
    # shipped to the node by the image stage, because the lab has no GPU to run the real one on.
    lab_stand_in: Literal["fake-sglang"] | None = None

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, value: str) -> str:
        if value not in stacks.available():
            raise ValueError(f"unknown stack {shown(value, quote=True)} (known: {', '.join(stacks.available())})")
        return value

    @model_validator(mode="after")
    def _pins_of_the_stack(self) -> Image:
        stack = stacks.load(self.stack)
        extra = [name for name, value in self.pins.model_dump().items() if value is not None and name not in stack.pins]
        if extra:
            raise ValueError(f"image.pins: stack {self.stack} has no pin {', '.join(extra)} "
                             f"(its pins: {', '.join(stack.pins)})")
        if stack.toolchain and self.toolchain != "base":
            raise ValueError(f"image.toolchain {self.toolchain}: stack {self.stack} brings its own ({stack.toolchain})")
        return self

    @property
    def base_name(self) -> str:
        """The base built on: the host file's, else the stack's."""
        return self.base or stacks.load(self.stack).base

    def pinned(self) -> dict[str, str]:
        """Every pin of the image: the stack's, with the host file's on top."""
        own = {name: value for name, value in self.pins.model_dump().items() if value is not None}
        return {**stacks.load(self.stack).versions(), **own}

    @field_validator("base")
    @classmethod
    def _known_base(cls, value: str | None) -> str | None:
        return value if value is None else base_text(value)


class Model(Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    path: PathValue
    served_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$")] | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{shown(str(value))} must be an absolute path on the node")
        return value


# A float flag is finite: inf or nan would reach sglang as text, and plan --json as non-JSON.
FlagOverride = str | int | Annotated[float, Field(allow_inf_nan=False)] | bool | None


def ip_address_text(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{shown(value, quote=True)} is not an IP address") from None
    return value


def exposed_needs_key(bind: str, api_key: SecretRef | None) -> None:
    """A server (or router) reachable beyond loopback answers only with a key."""
    if not ipaddress.ip_address(bind).is_loopback and api_key is None:
        raise ValueError(f"bind {bind} is reachable from other machines: set api_key")


class Server(Strict):
    # A profile of gpunode/profiles; unset: the profile of the image's stack (stack.yml).
    profile: str | None = None
    bind: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    api_key: SecretRef | None = None
    flags: dict[str, FlagOverride] = {}
    env: dict[str, str] = {}

    @field_validator("profile")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in profiles.available():
            raise ValueError(f"unknown profile {shown(value, quote=True)} (known: {', '.join(profiles.available())})")
        return value

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return ip_address_text(value)

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, value: dict[str, FlagOverride]) -> dict[str, FlagOverride]:
        for flag, given in value.items():
            if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
                raise ValueError(f"{shown(flag, quote=True)} is not a long flag like --max-running-requests")
            # Abbreviations and other names of these need sglang's parser: _flag_problems.
            if (refusal := flag_refusal((flag,))) is not None:
                raise ValueError(f"{flag} {refusal}")
            if isinstance(given, str) and _USER_INFO.search(given):
                raise ValueError(f"{flag}: its value is a URL with user information (user@ or user:password@): "
                                 "credentials are never inline")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, given in value.items():
            if not re.fullmatch(ENV_NAME_RE, name):
                raise ValueError(f"{shown(name, quote=True)} is not an environment variable name")
            if name in OWNED_ENV:
                raise ValueError(f"{name} would change the GPUs the server sees: select them with {OWNED_ENV[name]}")
            if _SECRET_ENV.search(name.upper()):
                raise ValueError(f"{name} names a secret, never inline (plan prints server.env, docker inspect shows "
                                 f"it): server.env takes no secret reference; the server's key is server.api_key "
                                 f"({SECRET_REF}), and the weights are local (model.path)")
            if isinstance(given, str) and _USER_INFO.search(given):
                raise ValueError(f"{name}: its value is a URL with user information (user@ or user:password@): "
                                 "credentials are never inline")
        return value

    @model_validator(mode="after")
    def _exposed_needs_key(self) -> Server:
        exposed_needs_key(self.bind, self.api_key)
        return self


class P2pExpect(Strict):
    """Minimum unidirectional P2P bandwidth per pair class, decimal GB/s."""

    same_numa_gbps: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 45.0
    cross_numa_gbps: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 35.0
    nvlink_gbps: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 100.0
    required: bool = True


class Host(Strict):
    name: Annotated[str, Field(pattern=HOSTNAME_RE)]
    lab: bool = False
    ssh: Ssh
    dev_root: PathValue = Path("/dev")  # where the host's NVIDIA nodes are found
    facts_root: PathValue = Path("/")  # prefix for /proc, /sys, /etc reads (the lab replays recorded readings)
    api: ProxmoxApi
    driver: Driver
    prepare: Prepare = Prepare()
    container: Container
    image: Image = Image()
    model: Model
    server: Server = Server()
    p2p: P2pExpect = P2pExpect()

    @model_validator(mode="after")
    def _container_reachable(self) -> Host:
        network = self.container.network
        if self.container.ssh is None and network.address is None:
            # Without a static address the node's is known only once it runs: ssh.address says it.
            said = "container.network.ip is dhcp" if network.ip6 is None else f"container.network {network.describe()}"
            raise ValueError(f"{said}: give container.ssh.address so the node can be reached")
        return self

    @model_validator(mode="after")
    def _stand_in_only_in_the_lab(self) -> Host:
        if self.image.lab_stand_in and not self.lab:
            raise ValueError("image.lab_stand_in runs a fake server: only a lab host (lab: true) may set it")
        return self

    @model_validator(mode="after")
    def _lab_toolchain(self) -> Host:
        from gpunode.image import bases

        toolchain = bases.toolchains().get(self.image.toolchain)
        if toolchain is not None and toolchain.lab_only and not self.lab:
            raise ValueError(f"image.toolchain {toolchain.name} is a lab stand-in: only a lab host (lab: true) may set it")
        return self

    @property
    def profile_name(self) -> str:
        """The server's profile: the host file's, else the one the image's stack runs."""
        return self.server.profile or stacks.load(self.image.stack).profile

    @model_validator(mode="after")
    def _profile_and_driver_fit_the_stack(self) -> Host:
        stack = stacks.load(self.image.stack)
        profile = profiles.load(self.profile_name)
        if profile.stack != stack.name:
            raise ValueError(f"server.profile {profile.name} runs on stack {profile.stack}, but image.stack is "
                             f"{stack.name} (pick the stack's profile, {stack.profile}, or leave server.profile unset)")
        if int(self.driver.version.split(".")[0]) < stack.driver_min:
            raise ValueError(f"driver.version {self.driver.version} is older than {stack.driver_min}: stack "
                             f"{stack.name} (CUDA {stack.cuda}) needs >= {stack.driver_min}")
        return self

    @model_validator(mode="after")
    def _image_for_the_profile(self) -> Host:
        from gpunode.image import aot

        profile = profiles.load(self.profile_name)
        arch = aot.gpu_arch(self.image.gpu_model)
        if not arch.sm.startswith(profile.arch):
            raise ValueError(f"image.gpu_model {self.image.gpu_model} is {arch.sm}, but profile {profile.name} "
                             f"is for {profile.arch}")
        if isinstance(self.image.flashinfer_aot, list):
            known = [m.name for m in aot.profile_modules(stacks.load(self.image.stack), profile, self.server.flags)]
            unknown = [name for name in self.image.flashinfer_aot if name not in known]
            if unknown:
                raise ValueError(f"image.flashinfer_aot: {', '.join(unknown)} not among the profile's FlashInfer "
                                 f"modules ({', '.join(known) or 'none'})")
        return self

    @property
    def served_name(self) -> str:
        return self.model.served_name or profiles.load(self.profile_name).served_name


class RouterImage(Strict):
    """The router's own small image (gpunode.router.image): a base of images/sglang/bases.yml with
    CPython 3.11 (the router lock's), built where ``build_on`` says."""

    base: str = "debootstrap"
    # router: the router machine's engine builds it (it needs PyPI); local: this machine's engine
    # builds it and ships it there.
    build_on: Literal["router", "local"] = "router"
    ca_bundle: PathValue | None = None

    @field_validator("base")
    @classmethod
    def _known_base(cls, value: str) -> str:
        from gpunode.image import bases

        base_text(value)
        python = bases.base_of(value).python
        if python != "3.11":
            raise ValueError(f"{value} has Python {python}; the router's lock is for 3.11 (debootstrap or "
                             "debian:bookworm-slim)")
        return value


class Router(Strict):
    """SGLang's router (sglang-router) in front of every host's server: one endpoint for the fleet."""

    # A host of this file (the router runs in Docker on its GPU node, beside its server), or a
    # machine with Docker Engine reached over SSH.
    runs_on: Annotated[str, Field(pattern=HOSTNAME_RE)] | Ssh
    bind: str = "0.0.0.0"
    port: Annotated[int, Field(ge=1, le=65535)] = 30080
    # The router's Prometheus metrics (per-worker request counts), published on the router
    # machine's loopback only.
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 29000
    # The router's own choices (sglang_router/router_args.py) but manual, which routes by a
    # routing key clients must send.
    policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = "cache_aware"
    # The key clients give the router, and the router gives every worker: the hosts' servers must
    # take the same one (server.api_key).
    api_key: SecretRef | None = None
    # How often the router asks each worker's /health: a dead worker leaves the rotation after
    # three failed checks and comes back after two good ones (the router's own thresholds).
    health_check_interval_s: Annotated[int, Field(ge=1, le=3600)] = 10
    image: RouterImage = RouterImage()

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return ip_address_text(value)

    @model_validator(mode="after")
    def _exposed_needs_key(self) -> Router:
        exposed_needs_key(self.bind, self.api_key)
        if self.port == self.metrics_port:
            raise ValueError(f"port and metrics_port are both {self.port}")
        return self


class HostFile(Strict):
    version: Literal[1]
    hosts: Annotated[list[Host], Field(min_length=1)]
    router: Router | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_the_integer(cls, value: Any) -> Any:
        # Literal[1] takes true and 1.0 as 1, even in strict mode.
        if type(value) is not int:
            raise ValueError("must be 1")
        return value

    @property
    def router_host(self) -> Host | None:
        """The host whose GPU node runs the router, when ``router.runs_on`` names one."""
        if self.router is None or not isinstance(self.router.runs_on, str):
            return None
        return next((host for host in self.hosts if host.name == self.router.runs_on), None)


ROUTER_NODE = "router"  # the router machine's name in gpunode's inventory (group routers); no host may take it


def worker_address(host: Host) -> str:
    """Where the router reaches a host's server: its bind address, or the node's own when it binds all."""
    bind = ipaddress.ip_address(host.server.bind)
    address = str(host.container.reach.address) if bind.is_unspecified else host.server.bind
    return f"[{address}]" if ":" in address else address


def _router_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """What the router needs of the hosts: a host named by ``on``, servers it can reach with its
    one key, one model, and no port taken twice on one node."""
    router = hf.router
    if router is None:
        return []

    def at(path: tuple[str | int, ...], text: str) -> str:
        line = src.line_of(path)
        return f"{format_path(path)}: {text}" + (f" (line {line})" if line else "")

    problems: list[str] = []
    names = [host.name for host in hf.hosts]
    if isinstance(router.runs_on, str) and router.runs_on not in names:
        problems.append(at(("router", "runs_on"), f"{router.runs_on!r} is not a host of this file ({', '.join(names)})"))
    served = hf.hosts[0].served_name
    for index, host in enumerate(hf.hosts):
        if host.name == ROUTER_NODE:
            problems.append(at(("hosts", index, "name"), f"{host.name!r} is the router's own name in gpunode's inventory: "
                               "give the host another"))
        if ipaddress.ip_address(host.server.bind).is_loopback:
            problems.append(at(("hosts", index, "server", "bind"), f"{host.server.bind}: the router cannot reach a "
                               "server on loopback: bind 0.0.0.0 or the node's address (with server.api_key)"))
        bind = ipaddress.ip_address(host.server.bind)
        if bind.is_unspecified and bind.version == 4 and ":" in str(host.container.reach.address):
            # 0.0.0.0 listens on IPv4 only, and an IPv6-only node is reached at its IPv6 address.
            problems.append(at(("hosts", index, "server", "bind"), f"{host.server.bind} listens on IPv4 only, and the "
                               f"router reaches {host.name}'s node at {host.container.reach.address}: bind '::'"))
        if host.server.api_key != router.api_key:
            problems.append(at(("hosts", index, "server", "api_key"), "the router sends its one key to every worker: "
                               "give the same secret as router.api_key" if router.api_key else
                               "the router has no api_key to send: leave server.api_key unset too, or give router.api_key"))
        if host.served_name != served:
            problems.append(at(("hosts", index, "model", "served_name"), f"{host.served_name!r}: the router serves one "
                               f"model, and hosts[0] serves {served!r}"))
    # The machine it runs on: a host's GPU node, named or at the same address, or one of its own.
    runs_on = router.runs_on
    on_host = hf.router_host or next((host for host in hf.hosts if isinstance(runs_on, Ssh)
                                      and host.container.reach.address == runs_on.address), None)
    if on_host is not None:
        for key in ("port", "metrics_port"):
            if getattr(router, key) == on_host.server.port:
                problems.append(at(("router", key), f"{on_host.server.port} is taken on {on_host.name}'s node by its server"))
    ssh = runs_on if isinstance(runs_on, Ssh) else on_host.container.reach if on_host is not None else None
    if ssh is not None and ssh.connection == "ssh":
        machine = f"{on_host.name}'s node" if on_host is not None else "the router's machine"
        for key in ("port", "metrics_port"):
            if getattr(router, key) == ssh.port:
                problems.append(at(("router", key), f"{ssh.port} is taken on {machine} by its SSH server"))
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


def _at(src: YamlSource, path: tuple[str | int, ...], text: str) -> str:
    line = src.line_of(path)
    return f"{format_path(path)}: {text}" + (f" (line {line})" if line else "")


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
            problems.append(_at(src, ("hosts", index, "container", "vmid"), f"vmid {ct.vmid} repeats hosts[{first}]'s "
                                f"on the same Proxmox API {host.api.url} (one vmid per cluster): give another"))
        first = hostnames.setdefault((api, host.api.node, ct.hostname), index)
        if first != index:
            problems.append(_at(src, ("hosts", index, "container", "hostname"),
                                f"{shown(ct.hostname, quote=True)} repeats hosts[{first}]'s container on node "
                                f"{host.api.node} of {host.api.url}: give another"))
        for key, address in ct.network.addresses.items():  # IPv4 and IPv6 alike
            first = addresses.setdefault(address, index)
            # The same node address is _repeats' already.
            if first != index and hf.hosts[first].container.reach.address != ct.reach.address:
                problems.append(_at(src, ("hosts", index, "container", "network", key),
                                    f"{address} repeats hosts[{first}]'s container address: give another"))
        if ct.reach.connection == "ssh" and host.server.port == ct.reach.port:
            problems.append(_at(src, ("hosts", index, "server", "port"), f"{host.server.port} is taken on "
                                f"{host.name}'s node by its SSH server (container.ssh.port)"))
    return problems


def _keys_file_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """Each container's ssh_public_keys file, read and checked as Proxmox will check it
    (gpunode.sshkeys). A file that is not on this machine is the container stage's to report,
    before it sends anything: a host file may be validated where its keys are not."""
    problems: list[str] = []
    for index, host in enumerate(hf.hosts):
        path = host.container.ssh_public_keys
        if path is None or not os.path.lexists(path.expanduser()):
            continue
        try:
            sshkeys.load(path.expanduser())
        except sshkeys.KeysFileError as exc:
            problems.append(_at(src, ("hosts", index, "container", "ssh_public_keys"), str(exc)))
    return problems


# ----------------------------------------------------------------------------- sglang's own flags

STANDIN = PACKAGE / "lab" / "standin"  # sglang_<version>_args.json: each release's parser, dumped from it


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
    path = STANDIN / f"sglang_{version.replace('.', '_')}_args.json"
    if not path.is_file():
        return None
    table: dict[str, SglangArg] = {}
    for action in json.loads(path.read_text(encoding="utf-8"))["actions"]:
        choices = action["choices"]
        arg = SglangArg(tuple(action["flags"]), bool(action["takes_value"]), action["nargs"], action["type"],
                        None if choices is None else tuple(str(choice) for choice in choices))
        table.update(dict.fromkeys(arg.flags, arg))
    return table


# Without a dump of the release: the tensor-parallel size, under the names every release has.
_TP_ONLY = dict.fromkeys(profiles.TP_FLAGS, SglangArg(profiles.TP_FLAGS, True, None, "int", None))


def argparse_matches(flag: str, table: dict[str, SglangArg]) -> list[str]:
    """The option strings argparse takes ``flag`` for: itself, else each one it begins (argparse
    takes any unique prefix as an abbreviation, and refuses one that begins several as ambiguous)."""
    if flag in table:
        return [flag]
    return sorted(name for name in table if name.startswith(flag))


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
                problems.append(_at(src, path, f"{flag} is not a flag of {release}"
                                    + (f" (did you mean {close[0]}?)" if close else "")))
            continue
        if len(matches) > 1:
            listed = ", ".join(matches[:6]) + (", ..." if len(matches) > 6 else "")
            problems.append(_at(src, path, f"{flag} is ambiguous in {release}: it begins {listed}: "
                                "write the flag in full"))
            continue
        name, arg = matches[0], table[matches[0]]
        named = flag if name == flag else f"{flag} abbreviates {name}, which"
        if (refusal := flag_refusal(arg.flags)) is not None:
            problems.append(_at(src, path, f"{named} {refusal}"))
        elif arg in given:
            problems.append(_at(src, path, f"{flag} is {given[arg]} again, by another name: give it once"))
        elif arg in spelled and spelled[arg] != flag:
            problems.append(_at(src, path, f"{flag} is {spelled[arg]} by another name, which profile {profile.name} "
                                f"sets: write {spelled[arg]}, so that this value replaces the profile's instead of "
                                "both reaching sglang"))
        elif profiles.TP_FLAGS[0] in arg.flags and flag not in profiles.TP_FLAGS:
            # derive reads the size by these names (profiles.TP_FLAGS) for the checks and the bench.
            problems.append(_at(src, path, f"{flag} abbreviates {name}: write {' or '.join(profiles.TP_FLAGS)} in "
                                "full"))
        elif (why := _value_problem(flag, arg, value)) is not None:
            problems.append(_at(src, path, why))
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
        return [_at(src, where(tp_flag, gpus_path), f"{tp_flag} {_as_written(tp_value)}: the tensor-parallel size is "
                    "a whole number >= 1, the GPUs the server shards the model over")]
    named = (f"server {tp_flag} {tp}" if tp_value is not False and tp_flag else
             f"server {tp_flag}: false (sglang's default tensor-parallel size, 1)" if tp_flag else
             "sglang's default tensor-parallel size 1")
    if tp_flag and tp_flag not in host.server.flags:
        named += f" (profile {profile.name})"
    gpus = host.container.gpus
    if isinstance(gpus, list) and tp != len(gpus):
        return [_at(src, where(tp_flag, gpus_path), f"{named} needs {tp} GPUs but container.gpus selects {len(gpus)}: "
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
        return [_at(src, dp_path, f"{dp_flag} {_as_written(dp_value)}: the data-parallel size is a whole number >= 1")]
    dp_attention = any("--enable-dp-attention" in arg.flags and value is not False
                       for arg, (value, _) in launched.items())
    if dp > 1 and not dp_attention:
        return [_at(src, dp_path, f"{dp_flag} {dp} runs {dp} copies of the model, {dp} x {tp} GPUs, but gpunode gives "
                    "one server one tensor-parallel group: leave it 1, or add --enable-dp-attention (its DP ranks "
                    "share the TP GPUs)")]
    if dp > 1 and tp % dp:
        return [_at(src, dp_path, f"{dp_flag} {dp} must divide the tensor-parallel size {tp} with "
                    "--enable-dp-attention")]
    return []


def _plan_problems(hf: HostFile, src: YamlSource) -> list[str]:
    """What ``gpunode plan`` computes beyond the models, so that a valid file always has a plan:
    the CA bundles the image tags read on this machine, then the plan itself."""
    problems: list[str] = []
    bundles = [(("hosts", index, "image", "ca_bundle"), host.image.ca_bundle) for index, host in enumerate(hf.hosts)]
    if hf.router is not None:
        bundles.append((("router", "image", "ca_bundle"), hf.router.image.ca_bundle))
    for path, bundle in bundles:
        if bundle is not None and not (os.path.isfile(bundle) and os.access(bundle, os.R_OK)):
            problems.append(_at(src, path, f"{shown(str(bundle), quote=True)} is not a readable file on this machine "
                                "(the image's build context takes it from here)"))
    if problems:
        return problems
    from gpunode import plan
    from gpunode.image.context import ImageInputError

    for index, host in enumerate(hf.hosts):
        try:
            plan.plan_host(host)
        except (ImageInputError, ValueError, LookupError) as exc:
            problems.append(_at(src, ("hosts", index), f"plan cannot be made: {shown(str(exc), limit=240)}"))
    try:
        plan.router_plan(hf)
    except (ImageInputError, ValueError, LookupError) as exc:
        problems.append(_at(src, ("router",), f"plan cannot be made: {shown(str(exc), limit=240)}"))
    return problems


class HostFileError(Exception):
    """One or more problems with a host file; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# What a type error asks for, to say several at once where a key takes a union of types.
_WANTED = {"string_type": "a string", "int_type": "a whole number", "float_type": "a number",
           "bool_type": "true or false", "list_type": "a list", "dict_type": "a mapping (key: value)",
           "model_type": "a mapping (key: value)", "model_attributes_type": "a mapping (key: value)",
           "none_required": "null", "path_type": "a path"}
_YES_NO = {"yes", "no", "y", "n", "on", "off"}


def _found(given: Any) -> str:
    """What YAML made of a value, in the file's terms."""
    if given is None:
        return "null"
    if isinstance(given, bool):
        return "true/false"
    if isinstance(given, int):
        return "a whole number"
    if isinstance(given, float):
        return "a number"
    if isinstance(given, dict):
        return "a mapping"
    if isinstance(given, list):
        return "a list"
    return "text"


def _why_not(kind: str, given: Any) -> str:
    """A hint after a type error: what YAML 1.2 read, where a YAML 1.1 reading or a quote misleads."""
    if isinstance(given, (dict, list)):
        return f" (found {_found(given)})"
    if kind in ("int_type", "float_type") and isinstance(given, str):
        text = given.strip()
        if re.fullmatch(r"[-+]?0[0-9]+", text):
            return (f" ({shown(given, quote=True)} is text: a leading 0 is octal in YAML 1.1 and decimal in 1.2; "
                    "write it without the 0, or 0o... for octal)")
        if re.fullmatch(r"[-+]?[0-9]+(:[0-5]?[0-9])+(\.[0-9]*)?", text):
            return f" ({shown(given, quote=True)} is text: YAML 1.2 has no base-60 numbers)"
        if "_" in text and re.fullmatch(r"[-+]?[0-9][0-9_]*(\.[0-9_]*)?", text):
            return f" ({shown(given, quote=True)} is text: YAML 1.2 has no _ in numbers)"
        if re.fullmatch(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", text):
            return f" ({shown(given, quote=True)} is quoted: write the number without quotes)"
    if kind in ("int_type", "float_type") and isinstance(given, bool):
        return f" (found {_found(given)})"
    if kind == "int_type" and isinstance(given, float):
        return f" (found {shown(given)}: write it without a fraction)" if given.is_integer() else f" (found {shown(given)})"
    if kind == "bool_type":
        if isinstance(given, str) and given.lower() in _YES_NO:
            return f" ({shown(given, quote=True)} is text in YAML 1.2: write true or false)"
        if isinstance(given, str) and given.lower() in ("true", "false"):
            return f" ({shown(given, quote=True)} is quoted: write {given.lower()} without quotes)"
        if isinstance(given, (int, float)):
            return f" (found {_found(given)} {shown(given)})"
    if kind == "string_type" and not isinstance(given, str):
        return f" (YAML reads {shown(given)} as {_found(given)}: quote it)"
    return ""


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _WANTED:
        return f"must be {_WANTED[kind]}" + _why_not(kind, error.get("input"))
    if kind == "missing":
        return "required key is missing"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}"
    if kind in ("int_parsing", "int_from_float"):
        return "must be a whole number"
    if kind == "float_parsing":
        return "must be a number"
    if kind == "bool_parsing":
        return "must be true or false"
    if kind == "finite_number":
        return "must be a finite number (not .inf or .nan)"
    if kind == "string_pattern_mismatch":
        return f"has the wrong form (expected to match {ctx['pattern']})"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"]).lower()


def _suggest(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    names = list(model.model_fields)
    close = difflib.get_close_matches(key, names, n=1)
    # A word the key ends in (on -> runs_on): too short for difflib to call it close.
    close = close or [name for name in names if key and name.endswith("_" + key)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that the mapping at ``path`` is validated against, for suggestions."""
    model: Any = HostFile
    for part in path:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        for candidate in getattr(annotation, "__args__", ()) + (annotation,):
            inner = getattr(candidate, "__args__", ())
            for option in inner + (candidate,):
                if isinstance(option, type) and issubclass(option, BaseModel):
                    model = option
                    break
            else:
                continue
            break
        else:
            return None
    return model if isinstance(model, type) else None


def _file_loc(loc: tuple[Any, ...], data: Any, missing: bool) -> tuple[str | int, ...]:
    """``loc`` as a path in the file: pydantic names union branches in it ('str', 'list[int]',
    'Ssh', "literal['all']"); a part that is not a key or index of the data there is one, except
    the last of a missing key."""
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and type(part) is int and 0 <= part < len(node):
            node = node[part]
        elif not (missing and index == len(loc) - 1):
            continue
        path.append(part)
    return tuple(path)


def _one_per_key(errors: list[dict[str, Any]], data: Any) -> list[tuple[tuple[str | int, ...], dict[str, Any], str]]:
    """(path, error, message) per error; the type errors of a union's branches at one key become
    one message (``must be a string, a number or true or false``)."""
    out: list[tuple[tuple[str | int, ...], dict[str, Any], str]] = []
    wanted: dict[tuple[str | int, ...], list[dict[str, Any]]] = {}
    located = [(_file_loc(tuple(error["loc"]), data, error["type"] == "missing"), error) for error in errors]
    # A branch that took the value's type and found more wrong says more than the branches that
    # did not take it (runs_on: {port: x} is an Ssh with a bad port, not a string that is wrong).
    said = {loc for loc, error in located if error["type"] not in _WANTED}
    deeper = {loc[:cut] for loc, _ in located for cut in range(len(loc))}
    for loc, error in located:
        if error["type"] in _WANTED and (loc in said or loc in deeper):
            continue
        if error["type"] in _WANTED:
            if loc not in wanted:
                out.append((loc, error, ""))  # its message is made below, once its branches are all known
            wanted.setdefault(loc, []).append(error)
        else:
            out.append((loc, error, _message(error)))
    for position, (loc, error, text) in enumerate(out):
        if text:
            continue
        branches = wanted[loc]
        if len(branches) == 1:
            out[position] = (loc, error, _message(error))
            continue
        nouns = list(dict.fromkeys(_WANTED[branch["type"]] for branch in branches))
        if "a number" in nouns and "a whole number" in nouns:
            nouns.remove("a whole number")
        if len(nouns) == 1:
            out[position] = (loc, error, _message(error))
            continue
        nouns = ["true/false" if noun == "true or false" else noun for noun in nouns]
        out[position] = (loc, error, f"must be {', '.join(nouns[:-1])} or {nouns[-1]} (found {_found(error.get('input'))})")
    return out


def problems_from(exc: ValidationError, src: YamlSource) -> list[str]:
    """Turn pydantic's errors into ``path: message (line N)`` lines, in file order."""
    lines: list[tuple[int, str]] = []
    seen: set[str] = set()
    for loc, error, text in _one_per_key(exc.errors(), src.data):
        if error["type"] == "extra_forbidden":
            text = "unknown key" + _suggest(str(loc[-1]), _model_at(loc[:-1]))
        line = src.line_of(loc)
        entry = f"{format_path(loc)}: {text}" + (f" (line {line})" if line else "")
        if entry not in seen:
            seen.add(entry)
            lines.append((line or 0, entry))
    return [entry for _, entry in sorted(lines, key=lambda item: item[0])]


def parse(src: YamlSource) -> HostFile:
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
    # The plan is computed only from a file that passed every other rule.
    problems = problems or _plan_problems(hf, src)
    if problems:
        raise HostFileError(problems)
    return hf


def load(path: Path) -> HostFile:
    """Load and validate a host file; raise HostFileError listing every problem found."""
    try:
        src = load_yaml(path)
    except SourceError as exc:
        raise HostFileError([str(exc)]) from None
    try:
        return parse(src)
    except HostFileError as exc:
        # One line each whatever a rule wrote into it: HostFileError's text joins them with newlines.
        name = shown(str(path), limit=240)
        raise HostFileError([one_line(f"{name}: {problem}") for problem in exc.problems]) from None
