"""The host file's pydantic models: every section and key, its type and choices, and the rules
within one section (a gateway inside its network, a key for an exposed server). Rules that span
the fleet are gpunode.hostfile.fleet's, sglang's flags gpunode.hostfile.rules', and the wording of
pydantic's errors gpunode.hostfile.wording's.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from urllib.parse import urlsplit
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gpunode.catalogue import profiles

from gpunode.ground import regularfile

from gpunode.ground.nvidia import MIN_DRIVER_SM120, MINORS, UVM_NODES
from gpunode.catalogue import stacks
from gpunode.ground.text import shown

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
TEMPLATE_MARKS = ("{{", "{%", "{#")  # Jinja's delimiters: Ansible renders a string holding one
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
    from gpunode.catalogue import bases

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

    @field_validator("key_file", "known_hosts")
    @classmethod
    def _no_template(cls, value: Path | None) -> Path | None:
        # These become Ansible's connection variables, which Ansible renders as templates (the rest of
        # the host file crosses as data it never renders: gpunode.inventory.write).
        if value is not None and any(mark in str(value) for mark in TEMPLATE_MARKS):
            raise ValueError(f"{shown(str(value), quote=True, limit=60)} holds a template delimiter ({', '.join(TEMPLATE_MARKS)}), "
                             "which Ansible would run as code: rename the file")
        return value


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
    # The PCIe fabric under P2P (FIELD-NOTES s13), each off unless asked: clear ACS redirect at boot
    # on the downstream ports of switches shared by GPUs (an owned setpci unit); give the nvidia
    # module the P2P registry keys that direct-attached GPUs need (an owned modprobe.d file);
    # pcie_aspm=off pcie_port_pm=off on the kernel command line. Each takes effect at the next boot
    # or module reload.
    clear_acs: bool = False
    p2p_registry: bool = False
    link_power_off: bool = False


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
    # Lab only: the serve and smoke stages run the fake SGLang server's image (gpunode_lab.image),
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


COMMIT_RE = r"^[0-9a-f]{40}$"
# Folders the weights never come from or go to: the kernel's, Proxmox's cluster file system, the root.
_NOT_A_MODEL_DIR = ("/proc", "/sys", "/dev", "/run", "/etc/pve", "/boot")
# Where each key of model: belongs (source -> the keys it takes besides id, path, served_name, verify).
MODEL_SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "hub": ("revision", "endpoint", "token", "store", "workers"),
    "host_path": ("host_path",),
    "node_path": (),
}


def _model_dir(value: Path, where: str) -> Path:
    """An absolute folder, not the root and not under a system tree, without '..' (pve-container
    refuses '..' in a mount point path)."""
    if not value.is_absolute():
        raise ValueError(f"{shown(str(value))} must be an absolute path {where}")
    # The container stage writes it into an mpN, a Proxmox property string: ',' would start another
    # key (",ro=0" would make the mount writable) and '=' in the volume part would make it a key
    # (pve-common src/PVE/JSONSchema.pm parse_property_string); control characters end the config line.
    bad = sorted({c for c in str(value) if c in ",=" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"{shown(str(value))}: a path with {', '.join(repr(c) for c in bad)} cannot be a Proxmox "
                         "mount point (its mpN line is key=value pairs split at ',')")
    if ".." in value.parts:
        raise ValueError(f"{shown(str(value))}: a path with '..' (Proxmox refuses it in a mount point)")
    if value == Path("/") or any(value == Path(top) or Path(top) in value.parents for top in _NOT_A_MODEL_DIR):
        raise ValueError(f"{shown(str(value))} is {'the root' if value == Path('/') else 'under a system folder'} "
                         f"({', '.join(_NOT_A_MODEL_DIR)}): give a folder of its own")
    return value


class Model(Strict):
    """The weights: which (a Hub repo at a pinned commit), where they come from (``source``), where
    they are kept (``store`` on the Proxmox host, outside the container's disk) and how they are
    proven whole before the server starts (``verify``); README "The model"."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    path: PathValue  # where the container and the server see the weights

    @field_validator("id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        """The Hub's own rule (huggingface_hub utils/_validators.py validate_repo_id): no '--' or '..',
        each part starting and ending with a letter or digit, the name at most 96 characters; the store's
        folder for it is '<org>--<name>', which a '--' in either part would make ambiguous."""
        org, name = value.split("/")
        if "--" in value or ".." in value or len(name) > 96 or not all(
                part[0].isalnum() and part[-1].isalnum() for part in (org, name)):
            raise ValueError(f"{shown(value, quote=True)} is not a Hub repo id (namespace/name: letters, digits, '-', "
                             "'_' and '.', no '--' or '..', each part starting and ending with a letter or digit, "
                             "the name <= 96 characters)")
        return value

    served_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$")] | None = None
    # hub: fetched by the model stage into store; host_path: already on the Proxmox host (mounted
    # read-only); node_path: already inside the container at path.
    source: Literal["hub", "host_path", "node_path"] = "node_path"
    revision: Annotated[str, Field(pattern=COMMIT_RE)] | None = None  # hub: the 40-hex commit, never a branch
    endpoint: str | None = None  # hub: a site's mirror (HF_ENDPOINT); unset: https://huggingface.co
    token: SecretRef | None = None  # hub: for a gated or private repo
    store: PathValue | None = None  # hub: a folder on the Proxmox host that keeps the weights
    host_path: PathValue | None = None  # host_path: the folder on the Proxmox host holding them
    verify: Literal["full", "sizes"] = "sizes"
    workers: Annotated[int, Field(ge=1, le=64)] = 8  # parallel downloads and hashes

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return _model_dir(value, "on the node")

    @field_validator("store", "host_path")
    @classmethod
    def _host_dir(cls, value: Path | None) -> Path | None:
        return value if value is None else _model_dir(value, "on the Proxmox host")

    @field_validator("revision", mode="before")
    @classmethod
    def _pinned(cls, value: Any) -> Any:
        if isinstance(value, str) and not re.fullmatch(COMMIT_RE, value):
            raise ValueError(f"{shown(value, quote=True, limit=60)} is not a pinned revision: give the 40-hex commit "
                             "(the repo's history on the Hub lists it), never a branch or tag, which can move")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{shown(value, quote=True, limit=80)} is not an http(s) URL")
        if parts.query or parts.fragment:
            raise ValueError("the endpoint takes no query or fragment: the Hub's routes are added to it")
        return url_text(value, "give the Hub token as model.token")

    @model_validator(mode="after")
    def _source_keys(self) -> Model:
        for source, keys in MODEL_SOURCE_KEYS.items():
            if source == self.source:
                continue
            for key in keys:
                # Given, not defaulted (a host dumped and read back carries its defaults too).
                if getattr(self, key) != type(self).model_fields[key].default and key not in MODEL_SOURCE_KEYS[self.source]:
                    raise ValueError(f"model.{key} is for source: {source}, not {self.source}")
        if self.source == "hub":
            missing = [key for key in ("revision", "store") if getattr(self, key) is None]
            if missing:
                raise ValueError(f"source: hub needs {' and '.join(f'model.{key}' for key in missing)} "
                                 "(the 40-hex commit to fetch; the Proxmox host's folder that keeps the weights)")
            if self.token is not None and self.token.vault is not None:
                raise ValueError("model.token: give {env: NAME} or {file: PATH}: the fetch reads it on this "
                                 "machine and hands it to the Proxmox host on the fetch's input")
        if self.source == "host_path" and self.host_path is None:
            raise ValueError("source: host_path needs model.host_path (the folder on the Proxmox host with the weights)")
        return self


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


# Prometheus' duration (model/time.go ParseDuration): a whole number and one unit, at most 100 years
# (Prometheus 2.42 refuses 293y and more: a Go duration's range); a retention of 0 would keep nothing.
RETENTION_RE = r"^([1-9][0-9]{0,3}[hd]|[1-9][0-9]{0,2}w|([1-9][0-9]?|100)y)$"
EMAIL_RE = r"^[A-Za-z0-9._%+=][A-Za-z0-9._%+=-]{0,63}@[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$"
# The monitor stage's own ports on the node's loopback: Debian's defaults for Prometheus,
# Alertmanager (its web and cluster ports) and node-exporter.
MONITOR_PORTS = {"prometheus": 9090, "alertmanager": 9093, "alertmanager cluster": 9094, "node-exporter": 9100}


WEBHOOK_URL_MAX = 2048


class AlertWebhook(Strict):
    """Alerts POSTed as Alertmanager's webhook JSON; a bearer token, when the receiver asks one."""

    url: str
    token: SecretRef | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # A receiver's URL may carry its own secret in the path (Slack's do): no message repeats more
        # than its scheme and address.
        parts = urlsplit(value)
        where = shown(f"{parts.scheme}://{parts.netloc}" if parts.netloc else parts.scheme or value[:8], quote=True, limit=60)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{where}... is not an http(s) URL")
        # A receiver's URL fits in a request line; a longer one is a paste gone wrong, and every
        # file that carries it (alertmanager.yml, the inventory, the plan) would carry it whole.
        if len(value) > WEBHOOK_URL_MAX:
            raise ValueError(f"{where}... is {len(value)} characters long: at most {WEBHOOK_URL_MAX}")
        # urlsplit drops tabs and newlines without a word; Alertmanager refuses them, and any control character.
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or not value.isascii():
            raise ValueError(f"{where}... holds a control or non-ASCII character (percent-encode it)")
        if "%" in parts.netloc:
            raise ValueError(f"{where}: an IPv6 zone (%) in the address, which Alertmanager cannot read")
        try:
            parts.port  # noqa: B018 - urlsplit reads the port only when asked
        except ValueError:
            raise ValueError(f"{where}: the port is not a number in 0-65535") from None
        return url_text(value, "give the receiver's bearer token as monitor.alerts.webhook.token")


class AlertEmail(Strict):
    """Alerts mailed through an SMTP smarthost (host:port), logging in when ``username`` is given."""

    to: Annotated[str, Field(pattern=EMAIL_RE)]
    sender: Annotated[str, Field(pattern=EMAIL_RE)]
    smarthost: str
    username: Annotated[str, Field(pattern=r"^[A-Za-z0-9._%+=@-]{1,254}$")] | None = None
    password: SecretRef | None = None

    @field_validator("smarthost")
    @classmethod
    def _smarthost(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
            raise ValueError(f"{shown(value, quote=True, limit=80)} is not host:port (the SMTP server and its port)")
        if ":" in host and not (host.startswith("[") and host.endswith("]")):
            raise ValueError(f"{shown(value, quote=True, limit=80)}: an IPv6 address goes in brackets, [ADDRESS]:PORT")
        address_text(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        return value

    @model_validator(mode="after")
    def _password_with_user(self) -> AlertEmail:
        if self.password is not None and self.username is None:
            raise ValueError("password without username: give monitor.alerts.email.username too")
        return self


class MonitorAlerts(Strict):
    webhook: AlertWebhook | None = None
    email: AlertEmail | None = None

    @model_validator(mode="after")
    def _somewhere(self) -> MonitorAlerts:
        if self.webhook is None and self.email is None:
            raise ValueError("alerts need somewhere to go: give webhook or email")
        return self


class Monitor(Strict):
    """The monitor stage on this host's GPU node (README "Monitoring"): Debian's Prometheus,
    Alertmanager and node-exporter, gpunode's GPU exporter, all on the node's loopback."""

    alerts: MonitorAlerts
    retention: Annotated[str, Field(pattern=RETENTION_RE)] = "15d"  # Prometheus' --storage.tsdb.retention.time
    scrape_interval_s: Annotated[int, Field(ge=1, le=300)] = 15  # also how often the rules are evaluated
    gpu_exporter_port: Annotated[int, Field(ge=1, le=65535)] = 9835

    @property
    def ports(self) -> dict[str, int]:
        """Every port the stage listens on, on the node's loopback, by what listens there."""
        return {**MONITOR_PORTS, "the GPU exporter": self.gpu_exporter_port}

    def port_owner(self, port: int) -> str | None:
        """What of the stage listens on ``port`` on the node, if anything does."""
        return next((name for name, own in self.ports.items() if own == port), None)

    @model_validator(mode="after")
    def _own_port(self) -> Monitor:
        for name, port in MONITOR_PORTS.items():
            if self.gpu_exporter_port == port:
                raise ValueError(f"gpu_exporter_port {port} is {name}'s port on the node")
        return self


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
    monitor: Monitor | None = None

    @model_validator(mode="after")
    def _monitor_ports_free(self) -> Host:
        if self.monitor is not None:
            taken = self.monitor.port_owner(self.server.port)
            if taken:
                raise ValueError(f"server.port {self.server.port} is {taken}'s port on the node (monitor)")
            reach = self.container.reach
            taken = self.monitor.port_owner(reach.port)
            if reach.connection == "ssh" and taken:
                raise ValueError(f"container.ssh.port {reach.port} is {taken}'s port on the node (monitor)")
        return self

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
        from gpunode.catalogue import bases

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
        from gpunode.catalogue import aot

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
    """The router's own small image (gpunode.derive.routerimage): a base of images/sglang/bases.yml with
    CPython 3.11 (the router lock's), built where ``build_on`` says."""

    base: str = "debootstrap"
    # router: the router machine's engine builds it (it needs PyPI); local: this machine's engine
    # builds it and ships it there.
    build_on: Literal["router", "local"] = "router"
    ca_bundle: PathValue | None = None

    @field_validator("base")
    @classmethod
    def _known_base(cls, value: str) -> str:
        from gpunode.catalogue import bases

        base_text(value)
        python = bases.base_of(value).python
        if python != "3.11":
            raise ValueError(f"{value} has Python {python}; the router's lock is for 3.11 (debootstrap or "
                             "debian:bookworm-slim)")
        return value


class Rolling(Strict):
    """How a change that restarts servers goes through the fleet (gpunode.rolling): ``batch`` hosts at a
    time, each taken out of the router and drained first; a batch stops the roll when more than
    ``max_fail_percent`` of it fails (Ansible's serial and max_fail_percentage)."""

    batch: Annotated[int, Field(ge=1, le=1000)] = 1
    max_fail_percent: Annotated[int, Field(ge=0, le=100)] = 0
    # How long a drain waits for the requests a server holds to end before its restart goes on.
    drain_timeout_s: Annotated[int, Field(ge=0, le=86400)] = 300


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
    rolling: Rolling = Rolling()

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
