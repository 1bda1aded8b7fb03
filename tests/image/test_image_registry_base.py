"""The registry base up to the pull, against a local registry on loopback.

NVIDIA's CUDA 12.8 devel base is not reachable here (no Docker Hub). Debian's docker-registry (the
CNCF distribution registry, 2.8) runs on 127.0.0.1 and holds small stand-in images under the real
name, as a site's registry mirror would (``127.0.0.1:<port>/nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04``).
What is proven: the pull, the digest recorded, a moved tag said, a digest pin honoured; the build
then fails at its first step, because the stand-ins hold one file and no shell (what a real base
would run there is rendered and unit-tested in tests/unit/test_image_bases.py).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import docker
import pytest
from rich.console import Console

from gpunode.hostfile import Image
from gpunode.stages.image import BuildError, build
from gpunode.stages.image.base import BaseDigest, ensure_registry_base
from gpunode.catalogue.bases import parse
from gpunode.derive.imagecontext import LABEL_PREFIX

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import PortTaken, on_free_port  # noqa: E402 - tests/ put on the path just above

pytestmark = pytest.mark.image

DEVEL = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def start_registry(binary: str, folder: Path, port: int) -> tuple[subprocess.Popen[bytes], int]:
    """docker-registry on 127.0.0.1:``port``, answering its API; PortTaken when the port was taken
    before it bound it (it binds the port itself, so the port cannot be handed over bound)."""
    config = folder / f"config-{port}.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
                      f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n")
    log = folder / f"registry-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            said = log.read_text(errors="replace")
            if "address already in use" in said:
                raise PortTaken(port, said.strip().splitlines()[-1])
            pytest.fail(f"docker-registry exited ({process.returncode}) on 127.0.0.1:{port}: {said[-2000:]}")
        try:
            # The registry's own answer, not just an open port: another server could hold the port.
            with DIRECT.open(f"http://127.0.0.1:{port}/v2/", timeout=5) as answer:
                if answer.headers.get("Docker-Distribution-Api-Version", "").startswith("registry/2"):
                    return process, port
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.terminate()
            process.wait(timeout=10)
            pytest.fail(f"docker-registry did not answer on 127.0.0.1:{port}: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on loopback for this module, its storage in a temporary folder."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed (scripts/setup installs it)")
    folder = tmp_path_factory.mktemp("registry")
    process, port = on_free_port(lambda port: start_registry(binary, folder, port))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def stand_in(client: docker.DockerClient, ref: str, content: str, labels: dict[str, str] | None = None) -> str:
    """A one-file image under ``ref`` (FROM scratch: nothing to pull)."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", b"FROM scratch\nCOPY marker /marker\n"), ("marker", content.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=ref, labels=labels or {}, rm=True)
    return str(image.id)


def push(client: docker.DockerClient, ref: str) -> None:
    repository, tag = ref.rsplit(":", 1)
    for line in client.images.push(repository, tag=tag, stream=True, decode=True):
        assert "error" not in line, line


@pytest.fixture
def cleanup(engine: docker.DockerClient, registry: str) -> Iterator[list[str]]:
    """Removes the refs and images a test made on the engine (tags first, then the images)."""
    refs: list[str] = []
    yield refs
    for ref in sorted(refs, key=lambda r: r.startswith("sha256:")):
        try:
            engine.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_pull_records_the_digest_and_a_moved_tag_is_said(engine: docker.DockerClient, registry: str,
                                                        cleanup: list[str]) -> None:
    ref = f"{registry}/{DEVEL}"
    base = parse(ref)
    assert (base.registry, base.name) == (registry, DEVEL)
    cleanup.extend([ref, f"{registry}/gpunode-test/built-from-first:1"])

    cleanup.append(stand_in(engine, ref, "first"))
    push(engine, ref)
    engine.images.remove(ref, force=True)
    first = ensure_registry_base(engine, base, Console(file=io.StringIO()))
    assert first.digest is not None and first.digest.startswith("sha256:")
    assert first.earlier == () and first.moved() is None

    # An image gpunode built from that content: its labels record the digest (gpunode.stages.image.build).
    stand_in(engine, f"{registry}/gpunode-test/built-from-first:1", "server",
             labels={f"{LABEL_PREFIX}.base": ref, f"{LABEL_PREFIX}.base.digest": first.digest})
    # Upstream republishes the tag with other content.
    cleanup.append(stand_in(engine, ref, "second"))
    push(engine, ref)
    engine.images.remove(ref, force=True)
    said = io.StringIO()
    second = ensure_registry_base(engine, base, Console(file=said, width=300))
    assert second.digest is not None and second.digest != first.digest
    assert second.earlier == ((f"{registry}/gpunode-test/built-from-first:1", first.digest),)
    message = second.moved()
    assert message == (f"base {ref} now has digest {second.digest}, but {registry}/gpunode-test/built-from-first:1 "
                       f"was built from {first.digest}: the tag moved upstream. To build from the earlier content, "
                       f"set image.base: {ref}@{first.digest}")
    assert message in said.getvalue().replace("\n", "")

    # Pinned by digest: the earlier content, whatever the tag says now.
    pinned = ensure_registry_base(engine, parse(f"{ref}@{first.digest}"), Console(file=io.StringIO()))
    assert pinned == BaseDigest(ref, first.digest)
    marker = engine.containers.create(f"{ref}@{first.digest}", command=["x"])
    try:
        archive, _ = marker.get_archive("/marker")
        with tarfile.open(fileobj=io.BytesIO(b"".join(archive))) as tar:
            member = tar.extractfile("marker")
            assert member is not None and member.read() == b"first"
    finally:
        marker.remove(force=True)


def test_build_from_the_mirror_pulls_then_stops_at_its_first_step(engine: docker.DockerClient, registry: str,
                                                                  cleanup: list[str], tmp_path: Path) -> None:
    ref = f"{registry}/{DEVEL}"
    cleanup.append(ref)
    cleanup.append(stand_in(engine, ref, "no shell in here"))
    push(engine, ref)
    engine.images.remove(ref, force=True)
    output = io.StringIO()
    with pytest.raises(BuildError) as failure:
        build(Image(base=ref), None, Console(file=output, width=300), aot=None)
    said = output.getvalue()
    assert f"base {ref}: pulling" in said and f"base {ref}: digest sha256:" in said
    assert f"building from {ref}" in said
    # The first step of a registry base installs its system packages with apt-get: no shell here.
    assert "apt-get update" in str(failure.value)
