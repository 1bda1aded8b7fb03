"""Fixtures for the real image build: the local Docker engine, the built image, cleanup."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

import docker
import pytest
from docker.errors import DockerException, ImageNotFound
from rich.console import Console

import yaml

from gpunode import derive
from gpunode.hostfile import Host, Image, load
from gpunode.stages.image import BuildResult, build

# This machine's proxy intercepts TLS: the host's bundle holds its CA (README of images/sglang).
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def host_image() -> Image:
    return Image(base="debootstrap", ca_bundle=HOST_CA if HOST_CA.is_file() else None)


@pytest.fixture(scope="session")
def image_spec() -> Image:
    """The image section the tests build: the defaults, plus this machine's CA bundle."""
    return host_image()


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=3600)
        client.ping()
    except DockerException as exc:
        pytest.fail(f"the image tests need the local Docker engine (gpunode lab up starts it): {exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def built(engine: docker.DockerClient, image_spec: Image) -> BuildResult:
    """The real image, built once per session (minutes cold; the tag exists afterwards, so later
    sessions skip it). The image is kept: it is the cache the next run and the node stage use."""
    return build(image_spec, None, Console(stderr=True, force_terminal=False, width=160))


ROOT = Path(__file__).resolve().parents[2]
CURRENT = "sglang-0.5.23-cu130"
# What CI builds of the current stack's FlashInfer modules: the two that build in ~2 min here.
# fp4_gemm_cutlass_sm120 (~10 min) and fused_moe_120 (~45 min on 2 cores) build the same way
# (benchmarks/aot_build.py --stack sglang-0.5.23-cu130 times them); sampling is left to the JIT.
CURRENT_CI_MODULES = ["sparse_mla_sm120", "fp4_quantization_120f"]


def lab_host(tmp: Path, **image: object) -> Host:
    """The lab host file with image settings changed, loaded (and validated) like any host file;
    a stack other than the seeds' brings its own base."""
    data = yaml.safe_load((ROOT / "inventory" / "lab" / "host.yml").read_text())
    data["hosts"][0]["image"].update(image)
    if image.get("stack"):
        data["hosts"][0]["image"].pop("base", None)
    path = tmp / "host.yml"
    path.write_text(yaml.safe_dump(data))
    return load(path).hosts[0]


@pytest.fixture(scope="session")
def make_lab_host() -> Callable[..., Host]:
    return lab_host


@pytest.fixture(scope="session")
def current_host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return lab_host(tmp_path_factory.mktemp("current"), stack=CURRENT, flashinfer_aot=CURRENT_CI_MODULES)


@pytest.fixture(scope="session")
def current_built(engine: docker.DockerClient, current_host: Host) -> BuildResult:
    """The current stack's image as the lab host file asks for it, with CI's modules: built once (the
    ~11 GB install layer is minutes cold), kept as the next run's cache."""
    return build(current_host.image, None, Console(stderr=True, force_terminal=False, width=160),
                 aot=derive.aot_plan(current_host))


def parent_chain(client: docker.DockerClient, image_id: str) -> list[str]:
    """The image and its parents (the classic builder records one image per step)."""
    chain = []
    while image_id:
        chain.append(image_id)
        try:
            image_id = client.images.get(image_id).attrs.get("Parent", "")
        except ImageNotFound:
            break
    return chain


def dangling_branches(client: docker.DockerClient, built_id: str, since: float) -> list[str]:
    """Untagged images made after ``since`` that branch off the built image's steps: what a test's
    variant build leaves behind. Images of other builds on the same engine are left alone."""
    ours = set(parent_chain(client, built_id))
    found = []
    for image in client.images.list(filters={"dangling": True}):
        if _created(image.attrs.get("Created", "")) < since:
            continue
        if ours & set(parent_chain(client, image.id)[1:]):
            found.append(image.id)
    return found


def _created(stamp: str) -> float:
    if not stamp:
        return 0.0
    return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


@pytest.fixture
def leftovers(engine: docker.DockerClient, built: BuildResult) -> Iterator[None]:
    """Removes the untagged images a test's builds leave on top of the built image."""
    started = time.time() - 1
    yield
    for image_id in dangling_branches(engine, built.image_id, started):
        engine.images.remove(image_id, force=True)
