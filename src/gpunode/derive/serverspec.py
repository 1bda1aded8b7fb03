"""The server container, as data: ``container_spec(...)`` returns the keyword arguments for
``docker_client.containers.run`` (or ``.create``), with no Docker call made.

Choices, each for a reason:

* GPUs and the driver from the host down (``GpuHandoff``): by default the node's CDI spec
  (``--device gpunode.io/gpu=all``) on a Docker with CDI, else the same list by hand: the
  ``/dev/nvidia*`` nodes one by one plus each driver file read-only under /usr/local/nvidia, where
  the image's PATH and LD_LIBRARY_PATH look; or NVIDIA's runtime
  (``--gpus``) when the host file picks ``nvidia-runtime``.
* ``ipc_mode="host"``: NCCL and torch multiprocessing share memory through /dev/shm, which the
  node's is large enough for; a private /dev/shm (``shm_size``) is used only when IPC is not shared.
* ulimits ``memlock`` unlimited (NCCL pins buffers) and ``stack`` 64 MiB (NCCL's own advice).
* ``init=True``: sglang forks schedulers and a detokenizer; tini reaps them and passes signals on.
* The model directory bind-mounted read-only at /model (a ``Mount``: a missing source is an error
  rather than an empty directory Docker made up).
* A named volume, ``<name>-jit-cache``, holds FlashInfer's workspace (its JIT cache,
  ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``): a kernel compiled at run time, outside the
  set the image built ahead of time, is compiled once per node rather than once per container.
* Port published on the host file's ``bind`` address only; inside its own network namespace the
  server listens on 0.0.0.0, which nothing outside reaches except through that one binding.
* The API key never appears in the command line, the environment or ``docker inspect``: sglang
  reads it only as ``--api-key`` or from a ``--config`` YAML file, whose reader splits it into two
  arguments, so a key beginning with ``-`` would be taken for a flag (FIELD-NOTES s10). The
  container runs gpunode's launcher (``gpunode/derive/serverlaunch.py``), which reads the key file and
  hands sglang one ``--api-key=KEY``; ``ensure_server`` writes both files into the container
  before starting it, and the launcher's path carries its digest, so a changed launcher is a
  changed command.
* Restart ``unless-stopped``: the server comes back after the node reboots; a crash during
  ``gpunode serve`` is caught and the container stopped, so a broken launch does not loop.
* A label with a hash of all of the above: the same settings leave a running server alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from gpunode.catalogue.handoff import GpuHandoff
from gpunode.derive import serverlaunch as launch

CONTAINER_NAME = "gpunode-sglang"
LABEL_ROLE = "io.gpunode.role"
LABEL_HASH = "io.gpunode.config-hash"
LABEL_CONFIG = "io.gpunode.config"  # the hashed settings, readable, to say what changed
ROLE = "sglang-server"
MODEL_MOUNT = "/model"
API_KEY_FILE = launch.KEY_FILE
LISTEN_INSIDE = "0.0.0.0"
STACK_BYTES = 64 * 1024 * 1024
JIT_CACHE_MOUNT = "/var/cache/gpunode"
JIT_CACHE_ENV = {"FLASHINFER_WORKSPACE_BASE": JIT_CACHE_MOUNT}


def jit_cache_volume(name: str) -> str:
    """The named volume of a server container's JIT caches: it outlives the container."""
    return f"{name}-jit-cache"




@dataclass(frozen=True)
class RestartPolicy:
    name: Literal["unless-stopped", "on-failure", "no"] = "unless-stopped"
    max_retries: int = 0  # on-failure only

    def docker_kwargs(self) -> dict[str, Any]:
        policy: dict[str, Any] = {"Name": self.name}
        if self.name == "on-failure":
            policy["MaximumRetryCount"] = self.max_retries
        return {"restart_policy": policy}


@cache
def launcher() -> tuple[str, bytes]:
    """Where the launcher goes in the container (its path names its digest) and its bytes."""
    content = Path(launch.__file__).read_bytes()
    return f"/run/gpunode/sglang-launch-{hashlib.sha256(content).hexdigest()[:12]}.py", content


def container_argv(argv: Sequence[str], with_api_key: bool) -> list[str]:
    """The launch argv as the container runs it: listen on every address of the container's own
    namespace (Docker publishes only the host file's address), no ``--api-key`` on the command
    line, and with a key ``python3 <launcher> MODULE ...`` in place of ``python3 -m MODULE ...``."""
    out: list[str] = []
    for arg in argv:
        flag = arg.partition("=")[0]
        if flag == "--api-key":
            continue  # the plan's placeholder or a value: neither belongs on the command line
        out.append(f"--host={LISTEN_INSIDE}" if flag == "--host" else arg)
    if with_api_key:
        if out[1:2] != ["-m"]:
            raise ValueError(f"the launch does not run a module (python3 -m MODULE ...): {out[:3]}")
        out[1] = launcher()[0]
    return out


def config_hash(spec: Mapping[str, Any]) -> str:
    """sha256 of the spec's settings (labels excluded), in a stable JSON form."""
    return hashlib.sha256(canonical(spec).encode()).hexdigest()


def canonical(spec: Mapping[str, Any]) -> str:
    settings = {key: value for key, value in spec.items() if key not in ("labels", "detach")}
    return json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))


def container_spec(
    *,
    image: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    model_dir: str,
    bind: str,
    port: int,
    gpus: GpuHandoff,
    api_key: bool = False,
    name: str = CONTAINER_NAME,
    restart: RestartPolicy = RestartPolicy(),
    ipc_mode: str = "host",
    shm_size: str = "32g",
    log_max_size: str = "100m",
    memlock_bytes: int = -1,
) -> dict[str, Any]:
    """kwargs for ``client.containers.run(**spec)``; ``api_key`` says whether a key file is used
    (its value never enters the spec). ``memlock_bytes`` -1 is unlimited; a lower cap is only for a
    Docker that may not raise it (a machine that is itself a container without CAP_SYS_RESOURCE)."""
    from docker.types import LogConfig, Mount, Ulimit  # the Docker SDK only where a container is made: validate and plan load none

    spec: dict[str, Any] = {
        "image": image,
        "command": container_argv(argv, api_key),
        "name": name,
        "detach": True,
        "environment": dict(sorted({**JIT_CACHE_ENV, **env}.items())),
        "mounts": [Mount(target=MODEL_MOUNT, source=str(model_dir), type="bind", read_only=True),
                   Mount(target=JIT_CACHE_MOUNT, source=jit_cache_volume(name), type="volume"), *gpus.mounts()],
        "ports": {f"{port}/tcp": (bind, port)},
        "ipc_mode": ipc_mode,
        "ulimits": [Ulimit(name="memlock", soft=memlock_bytes, hard=memlock_bytes),
                    Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES)],
        "init": True,
        "log_config": LogConfig(type="json-file", config={"max-size": log_max_size, "max-file": "3"}),
        **gpus.docker_kwargs(),
        **restart.docker_kwargs(),
    }
    if ipc_mode != "host":
        spec["shm_size"] = shm_size
    settings = canonical(spec)
    spec["labels"] = {LABEL_ROLE: ROLE, LABEL_HASH: config_hash(spec), LABEL_CONFIG: settings}
    return spec


def api_key_file_content(key: str) -> bytes:
    """The key file the launcher reads: json.dumps quotes any character a key may hold."""
    return (json.dumps({"api-key": key}) + "\n").encode()
