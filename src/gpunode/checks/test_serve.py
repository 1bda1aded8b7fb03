"""Layer serve: the SGLang server container on the node: running the right image and command
line, healthy, serving the configured model. Failures show the server's last log lines."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpunode.checks.conftest import container_get, docker_inspect, quote
from gpunode.derive.serverspec import API_KEY_FILE, JIT_CACHE_MOUNT, container_argv, jit_cache_volume

FIX = "run `gpunode provision --tags serve`"
LOG_LINES = 8
LOG_READ = 200
ACCESS_LINE = re.compile(r'INFO: +\S+ - "[A-Z]+ ')  # uvicorn's access log: says nothing about a failure


def _log_tail(node: Any, name: str) -> str:
    """The server's last log lines that are not HTTP access lines, joined on one line."""
    lines = node.run(f"docker logs --tail {LOG_READ} {quote(name)} 2>&1").stdout.splitlines()
    kept = [line.strip() for line in lines if line.strip() and not ACCESS_LINE.search(line)][-LOG_LINES:]
    return " | ".join(kept) or "(empty)"


def _container(node: Any, gpunode_derived: dict[str, Any]) -> dict[str, Any] | None:
    return docker_inspect(node, "container", gpunode_derived["server_container"])


def _running(node: Any, gpunode_derived: dict[str, Any]) -> dict[str, Any]:
    """The running server container; the checks that need one fail briefly without it (the
    reason and the log lines are test_server_container_running's)."""
    found = _container(node, gpunode_derived)
    if found is None or not found["State"]["Running"]:
        pytest.fail(f"the server container is not running (see test_server_container_running) -> {FIX}")
    return found


def _get(node: Any, gpunode_host: dict[str, Any], gpunode_derived: dict[str, Any], path: str) -> tuple[int, str]:
    """GET on the server from inside its container, with the key of its key file."""
    return container_get(node, gpunode_derived["server_container"], int(gpunode_host["server"]["port"]),
                         API_KEY_FILE, f"json.load(open({API_KEY_FILE!r}))['api-key']", path)


def test_server_container_running(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    name = gpunode_derived["server_container"]
    found = _container(gpu_node, gpunode_derived)
    assert found is not None, f"no server container {name} on the node -> {FIX}"
    state = found["State"]
    assert state["Running"], f"{name} is {state['Status']} (exit {state['ExitCode']}); last log lines: " \
                             f"{_log_tail(gpu_node, name)} -> {FIX}"


def test_server_runs_configured_image(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    container = _running(gpu_node, gpunode_derived)
    image = docker_inspect(gpu_node, "image", gpunode_derived["server_image"])
    assert image is not None and container["Image"] == image["Id"], \
        f"the server runs {container['Config']['Image']} ({container['Image'][:19]}), not the host file's " \
        f"{gpunode_derived['server_image']} -> run `gpunode provision --tags image,serve`"


def test_server_command_line(gpu_node: Any, gpunode_host: dict[str, Any], gpunode_derived: dict[str, Any]) -> None:
    container = _running(gpu_node, gpunode_derived)
    want = container_argv(gpunode_derived["launch"]["argv"], gpunode_host["server"]["api_key"] is not None)
    have = container["Config"]["Cmd"]
    assert have == want, f"the server runs {' '.join(have)}; the host file means {' '.join(want)} -> {FIX}"


def test_server_keeps_its_jit_cache_in_a_volume(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    """What FlashInfer compiles at run time (outside the image's ahead-of-time set) survives a restart."""
    container = _running(gpu_node, gpunode_derived)
    volume = jit_cache_volume(gpunode_derived["server_container"])
    mounts = {m.get("Destination"): m for m in container.get("Mounts", [])}
    found = mounts.get(JIT_CACHE_MOUNT)
    assert found is not None and found.get("Type") == "volume" and found.get("Name") == volume, \
        f"{JIT_CACHE_MOUNT} in the server is {found or 'not mounted'}, not the volume {volume} -> {FIX}"


def test_server_healthy(gpu_node: Any, gpunode_host: dict[str, Any], gpunode_derived: dict[str, Any]) -> None:
    _running(gpu_node, gpunode_derived)
    status, body = _get(gpu_node, gpunode_host, gpunode_derived, "/health_generate")
    assert status == 200, f"/health_generate answered {status or 'nothing'}: {body[:200]}; last log lines: " \
                          f"{_log_tail(gpu_node, gpunode_derived['server_container'])} -> {FIX}"


def test_server_serves_model(gpu_node: Any, gpunode_host: dict[str, Any], gpunode_derived: dict[str, Any]) -> None:
    _running(gpu_node, gpunode_derived)
    status, body = _get(gpu_node, gpunode_host, gpunode_derived, "/v1/models")
    assert status == 200, f"/v1/models answered {status or 'nothing'}: {body[:200]} -> {FIX}"
    names = [model.get("id") for model in json.loads(body).get("data", [])]
    assert gpunode_derived["served_name"] in names, \
        f"/v1/models lists {names}, not {gpunode_derived['served_name']} -> {FIX}"
