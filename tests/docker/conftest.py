"""Fixtures for the real-Docker tests: a client (skip without Docker, fail under CI), the fake
server image, and containers cleaned up after each test."""

from __future__ import annotations

import resource
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gpunode_lab.image import ensure_fake_image
from gpunode.derive.serverspec import jit_cache_volume

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import CiValueError, under_ci  # noqa: E402 - tests/ put on the path just above


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    try:
        ci = under_ci()
    except CiValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        if ci:
            pytest.fail(f"Docker is unavailable under CI: {exc}; .ci/run brings it up with `gpunode lab up`")
        pytest.skip(f"Docker is unavailable ({exc}): start it, e.g. `.venv/bin/gpunode lab up`")
    return client


@pytest.fixture(scope="session")
def fake_image(docker_client: docker.DockerClient) -> str:
    """The test image (built once, ~1-2 minutes the first time; kept while its tag exists)."""
    return ensure_fake_image(docker_client)


@pytest.fixture
def container_name(docker_client: docker.DockerClient) -> Iterator[str]:
    """A unique server container name, removed (with any bench containers, and the JIT cache volume
    the server spec names after it) after the test."""
    name = f"gpunode-test-sglang-{uuid.uuid4().hex[:8]}"
    yield name
    for container in docker_client.containers.list(all=True, filters={"name": name}):
        container.remove(force=True)
    for container in docker_client.containers.list(all=True, filters={"label": "io.gpunode.role=sglang-bench"}):
        container.remove(force=True)
    for volume in docker_client.volumes.list(filters={"name": jit_cache_volume(name)}):
        volume.remove(force=True)


@pytest.fixture(scope="session")
def memlock_bytes(docker_client: docker.DockerClient, fake_image: str) -> int:
    """-1 (unlimited, what the server asks for) where Docker may set it; else this machine's hard
    limit. A machine that is itself a container without CAP_SYS_RESOURCE cannot raise memlock."""
    unlimited = docker.types.Ulimit(name="memlock", soft=-1, hard=-1)
    probe = docker_client.containers.create(fake_image, ["true"], ulimits=[unlimited])
    try:
        probe.start()
    except docker.errors.APIError as exc:
        if "rlimit" not in str(exc):
            raise
        return resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    finally:
        probe.remove(force=True)  # a container whose start failed stays behind otherwise
    return -1
