"""The host file: one YAML document describing Proxmox hosts and their GPU containers.

Validated with pydantic; every problem becomes one line naming the YAML path and line, e.g.
``hosts[0].container.memory_gb: must be > 0 (line 14)``. Unknown keys are errors. Secrets are
never inline: a secret field takes ``{env: NAME}``, ``{file: PATH}`` or ``{vault: PATH}``.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpunode import profiles
from gpunode.nvidia import MIN_DRIVER_SM120
from gpunode import stacks
from gpunode.yamlsource import SourceError, YamlSource, format_path, load_yaml

HOSTNAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
DRIVER_RE = r"^\d{3}\.\d{1,3}(\.\d{1,3})?$"
SHA256_RE = r"^[0-9a-f]{64}$"
FINGERPRINT_RE = r"^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$"
PIN_RE = r"^\d+(\.\d+)*$"


class Strict(BaseModel):
    """Base for every section: unknown keys are errors, values are immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(Strict):
    """Where a secret comes from. Exactly one of env, file, vault; never the value itself."""

    env: Annotated[str, Field(pattern=ENV_NAME_RE)] | None = None
    file: Path | None = None
    vault: Path | None = None

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
            return self.file.expanduser().read_text(encoding="utf-8").strip()
        raise LookupError("vault secrets are decrypted by ansible-vault at run time")


class Ssh(Strict):
    address: str
    connection: Literal["ssh", "local"] = "ssh"  # local: gpunode runs on that machine itself
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None


class Tls(Strict):
    verify: bool = True
    ca_file: Path | None = None
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
            raise ValueError(f"user {self.user!r} needs a realm, e.g. root@pam")
        return self


class ProxmoxApi(Strict):
    url: Annotated[str, Field(pattern=r"^https://[^/\s]+(:\d+)?/?$")]
    node: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")]
    auth: ApiAuth
    tls: Tls = Tls()
    timeout_s: Annotated[int, Field(gt=0, le=3600)] = 300


class Network(Strict):
    bridge: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")] = "vmbr0"
    ip: str = "dhcp"
    gateway: str | None = None
    vlan: Annotated[int, Field(ge=1, le=4094)] | None = None

    @field_validator("ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        if value == "dhcp":
            return value
        try:
            iface = ipaddress.ip_interface(value)
        except ValueError:
            raise ValueError(f"{value!r} is not 'dhcp' or an address with prefix like 192.0.2.20/24") from None
        if "/" not in value:
            raise ValueError(f"{value!r} needs a prefix length, e.g. {value}/24")
        return str(iface)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an IP address") from None
        return value

    @model_validator(mode="after")
    def _gateway_in_subnet(self) -> Network:
        if self.ip == "dhcp":
            if self.gateway is not None:
                raise ValueError("gateway is set but ip is dhcp")
            return self
        if self.gateway and ipaddress.ip_address(self.gateway) not in ipaddress.ip_interface(self.ip).network:
            raise ValueError(f"gateway {self.gateway} is outside {ipaddress.ip_interface(self.ip).network}")
        return self

    @property
    def address(self) -> str | None:
        return None if self.ip == "dhcp" else str(ipaddress.ip_interface(self.ip).ip)


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
    ssh_public_keys: Path | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("select at least one GPU, or 'all'")
            if len(set(value)) != len(value):
                raise ValueError("lists a GPU twice")
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
    local_file: Path | None = None

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
    ca_bundle: Path | None = None
    pins: ImagePins = ImagePins()
    # Lab only: the serve and smoke stages run the fake SGLang server's image (gpunode.lab.image),
    # shipped to the node by the image stage, because the lab has no GPU to run the real one on.
    lab_stand_in: Literal["fake-sglang"] | None = None

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, value: str) -> str:
        if value not in stacks.available():
            raise ValueError(f"unknown stack {value!r} (known: {', '.join(stacks.available())})")
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
        from gpunode.image import bases

        if value is None:
            return value
        try:
            bases.parse(value)
        except bases.BaseRefError as exc:
            raise ValueError(str(exc)) from None
        return value


class Model(Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    path: Path
    served_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$")] | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{value} must be an absolute path on the node")
        return value


FlagOverride = str | int | float | bool | None


def ip_address_text(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None
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
            raise ValueError(f"unknown profile {value!r} (known: {', '.join(profiles.available())})")
        return value

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return ip_address_text(value)

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, value: dict[str, FlagOverride]) -> dict[str, FlagOverride]:
        for flag in value:
            if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
                raise ValueError(f"{flag!r} is not a long flag like --max-running-requests")
            if flag in ("--api-key", "--host", "--port"):
                raise ValueError(f"{flag} is set by server.{flag[2:].replace('-', '_').replace('host', 'bind')}, not server.flags")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(ENV_NAME_RE, name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _exposed_needs_key(self) -> Server:
        exposed_needs_key(self.bind, self.api_key)
        return self


class P2pExpect(Strict):
    """Minimum unidirectional P2P bandwidth per pair class, decimal GB/s."""

    same_numa_gbps: Annotated[float, Field(gt=0)] = 45.0
    cross_numa_gbps: Annotated[float, Field(gt=0)] = 35.0
    nvlink_gbps: Annotated[float, Field(gt=0)] = 100.0
    required: bool = True


class Host(Strict):
    name: Annotated[str, Field(pattern=HOSTNAME_RE)]
    lab: bool = False
    ssh: Ssh
    dev_root: Path = Path("/dev")  # where the host's NVIDIA nodes are found
    facts_root: Path = Path("/")  # prefix for /proc, /sys, /etc reads (the lab replays recorded readings)
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
        if self.container.ssh is None and self.container.network.address is None:
            raise ValueError("container.network.ip is dhcp: give container.ssh.address so the node can be reached")
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

    @model_validator(mode="after")
    def _gpus_match_tp(self) -> Host:
        profile = profiles.load(self.profile_name)
        tp = self.server.flags.get("--tp-size", profile.flag_value("--tp-size"))
        gpus = self.container.gpus
        if isinstance(gpus, list) and isinstance(tp, int) and tp > len(gpus):
            raise ValueError(f"server --tp-size {tp} needs {tp} GPUs but container.gpus selects {len(gpus)}")
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
    ca_bundle: Path | None = None

    @field_validator("base")
    @classmethod
    def _known_base(cls, value: str) -> str:
        from gpunode.image import bases

        try:
            bases.parse(value)
        except bases.BaseRefError as exc:
            raise ValueError(str(exc)) from None
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
        if host.server.api_key != router.api_key:
            problems.append(at(("hosts", index, "server", "api_key"), "the router sends its one key to every worker: "
                               "give the same secret as router.api_key" if router.api_key else
                               "the router has no api_key to send: leave server.api_key unset too, or give router.api_key"))
        if host.served_name != served:
            problems.append(at(("hosts", index, "model", "served_name"), f"{host.served_name!r}: the router serves one "
                               f"model, and hosts[0] serves {served!r}"))
    on_host = hf.router_host
    if on_host is not None:
        for key in ("port", "metrics_port"):
            if getattr(router, key) == on_host.server.port:
                problems.append(at(("router", key), f"{on_host.server.port} is taken on {on_host.name}'s node by its server"))
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


class HostFileError(Exception):
    """One or more problems with a host file; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
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
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if kind in ("string_type",):
        return "must be a string"
    if kind == "string_pattern_mismatch":
        return f"has the wrong form (expected to match {ctx['pattern']})"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be a mapping (key: value)"
    if kind == "list_type":
        return "must be a list"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"]).lower()


def _suggest(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    close = difflib.get_close_matches(key, list(model.model_fields), n=1)
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


def problems_from(exc: ValidationError, src: YamlSource) -> list[str]:
    """Turn pydantic's errors into ``path: message (line N)`` lines, in file order."""
    lines: list[tuple[int, str]] = []
    seen: set[str] = set()
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and "[" in part))
        # pydantic names union branches in loc (e.g. 'list[...]', 'literal[...]'); drop them.
        loc = tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("literal") or p.startswith("function"))))
        text = _message(error)
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
    problems = _repeats(hf, src) + _router_problems(hf, src)
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
        raise HostFileError([f"{path}: {problem}" for problem in exc.problems]) from None
