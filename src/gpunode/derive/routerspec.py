"""The router container, as data: its command line and ``docker run`` keyword arguments, no Docker
call made.

* SGLang's router (sglang-router 0.3.2, ``sglang_router.launch_router``) runs every host's server as
  a worker (``--worker-urls``), with the host file's policy; its health checker takes a dead worker
  out of rotation and puts it back once it answers again (``--health-check-interval-secs``).
* It listens on 0.0.0.0 inside its own network namespace; Docker publishes the host file's
  ``router.bind:port`` only, and the Prometheus metrics (per-worker request counts, read by
  ``gpunode bench``) on the router machine's loopback only.
* The API key is never on a command line: the image's launcher (images/router/launch.py) reads it
  from KEY_FILE, written into the container before it starts.
* Labels: gpunode's role and a hash of the settings, as the server's (gpunode.derive.serverspec), so the
  same settings leave a running router alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpunode.derive.serverspec import LABEL_CONFIG, LABEL_HASH, LABEL_ROLE, RestartPolicy, canonical, config_hash

CONTAINER_NAME = "gpunode-router"
ROLE = "sglang-router"
KEY_FILE = "/run/gpunode/router-api-key"  # images/router/launch.py reads it
LISTEN_INSIDE = "0.0.0.0"
METRICS_INSIDE = 29000  # the router's own default --prometheus-port
# A worker that is down when the router starts is retried in the background this long (the
# router's default is 1800 s); the router stage registers one that comes back later itself.
STARTUP_TIMEOUT_S = 600


def router_argv(port: int, workers: Sequence[str], policy: str, health_check_interval_s: int) -> list[str]:
    """The router's flags (sglang_router/router_args.py), without the API key: each value as
    ``--flag=value``, and the workers (URLs gpunode builds) after ``--worker-urls``, which takes many."""
    return [f"--host={LISTEN_INSIDE}", f"--port={port}", "--worker-urls", *workers, f"--policy={policy}",
            f"--health-check-interval-secs={health_check_interval_s}",
            f"--worker-startup-timeout-secs={STARTUP_TIMEOUT_S}",
            f"--prometheus-host={LISTEN_INSIDE}", f"--prometheus-port={METRICS_INSIDE}"]


def container_spec(*, image: str, argv: Sequence[str], bind: str, port: int, metrics_port: int,
                   name: str = CONTAINER_NAME, restart: RestartPolicy = RestartPolicy(),
                   log_max_size: str = "50m") -> dict[str, Any]:
    """kwargs for ``client.containers.run(**spec)``."""
    from docker.types import LogConfig  # the Docker SDK only where a container is made: validate and plan load none

    spec: dict[str, Any] = {
        "image": image,
        "command": list(argv),
        "name": name,
        "detach": True,
        "ports": {f"{port}/tcp": (bind, port), f"{METRICS_INSIDE}/tcp": ("127.0.0.1", metrics_port)},
        "init": True,
        "log_config": LogConfig(type="json-file", config={"max-size": log_max_size, "max-file": "3"}),
        **restart.docker_kwargs(),
    }
    spec["labels"] = {LABEL_ROLE: ROLE, LABEL_HASH: config_hash(spec), LABEL_CONFIG: canonical(spec)}
    return spec


def key_file_content(key: str) -> bytes:
    return (key + "\n").encode()
