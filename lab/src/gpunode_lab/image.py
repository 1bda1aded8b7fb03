"""The lab's stand-in server image (also the Docker tests' image): Debian 12 minbase with python3,
plus the fake SGLang server of gpunode_lab.standin. The lab has no GPU, so its serve and smoke stages run
this in place of the real image (host file: ``image.lab_stand_in: fake-sglang``).

Two tags, each built once and reused while it exists:

* ``gpunode-test/python-base:bookworm-1`` -- ``debootstrap --variant=minbase`` with python3, trimmed
  of docs, locales and apt lists, then ``docker import``-ed (about 1-2 minutes, once).
* ``gpunode-test/fake-sglang:<hash>`` -- the base plus the fakes (``gpunode_lab/standin``: the server, the
  bench stand-in and the ``sglang`` shim package) under ``/opt/fake-sglang`` with the shim on
  PYTHONPATH, so ``python3 -m sglang.launch_server ...`` -- the real command line -- runs the fake.
  The tag carries the files' hash: editing a fake builds a new one (a seconds-long ``docker
  build``), an unchanged one is never rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import docker

from gpunode.catalogue import handoff
from gpunode.catalogue.sglangargs import ARGS_DIR as SGLANG_ARGS
from gpunode_lab.contract import NVML_RECORDING, STANDIN

BASE_TAG = "gpunode-test/python-base:bookworm-1"
FAKE_REPO = "gpunode-test/fake-sglang"
MIRROR = "http://deb.debian.org/debian"
FAKES = STANDIN
FAKE_FILES = ("sglang_server.py", "bench_serving.py", "shim/sglang/__init__.py",
              "shim/sglang/launch_server.py", "shim/sglang/bench_serving.py")
# Each SGLang release's parser (gpunode's catalogue: host-file validation reads them too), beside
# the server that parses launches with it.
ARGS = sorted(SGLANG_ARGS.glob("sglang_*_args.json"))
# gpunode's GPU exporter runs from the server's image (the real one holds prometheus_client and
# nvidia-ml-py from the stack's lock): here the same two libraries, as this machine has them pinned by
# gpunode's own lock (both pure Python), and the lab's NVML, which replays a recorded GPU.
NVML_MODULE = "lab_nvml"
NVML_FILES = (("shim/lab_nvml.py", STANDIN / "lab_nvml.py"), ("shim/nvml_replay.py", STANDIN / "nvml_replay.py"),
              ("nvml_calls.json", NVML_RECORDING / "nvml_calls.json"))


def nvml_module() -> str:
    """What the GPU exporter in this image reads NVML through (``--nvml-module``)."""
    return NVML_MODULE


def _library_files() -> list[tuple[str, bytes]]:
    import prometheus_client
    import pynvml

    files = [("shim/pynvml.py", Path(pynvml.__file__).read_bytes())]
    package = Path(prometheus_client.__file__).resolve().parent
    files += [(f"shim/prometheus_client/{path.relative_to(package)}", path.read_bytes())
              for path in sorted(package.rglob("*.py"))]
    return files
IN_IMAGE = "/opt/fake-sglang"
# Removed from the rootfs before import: nothing the fake server needs, most of the size.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/lib/apt/lists",
        "var/cache/apt", "var/cache/debconf", "var/log")


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base(client: docker.DockerClient) -> None:
    """debootstrap a minbase bookworm with python3 into a temp dir and import it as BASE_TAG."""
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="gpunode-fake-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3-minimal,libpython3.11-stdlib",
                        "bookworm", str(root), MIRROR], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=1200)
        for rel in TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        # docker import through the CLI: the SDK's import_image would buffer the whole tar in memory.
        subprocess.run(["docker", "import", "-c", 'CMD ["python3"]', "-", BASE_TAG], stdin=tar.stdout,
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        tar.stdout.close()
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap rootfs failed")


# PATH and LD_LIBRARY_PATH as the real image sets them (images/sglang/Dockerfile.j2): the host's
# driver arrives at /usr/local/nvidia.
DOCKERFILE = (f"FROM {BASE_TAG}\nCOPY fakes/ {IN_IMAGE}/\n"
              f"ENV PYTHONUNBUFFERED=1 PYTHONPATH={IN_IMAGE}/shim "
              f"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{handoff.MOUNT_POINT}/bin "
              f"LD_LIBRARY_PATH={handoff.MOUNT_POINT}/lib64\n")


def _fake_files() -> list[tuple[str, bytes]]:
    return ([(name, (FAKES / name).read_bytes()) for name in FAKE_FILES] + [(path.name, path.read_bytes()) for path in ARGS]
            + [(name, path.read_bytes()) for name, path in NVML_FILES] + _library_files())


def fake_tag() -> str:
    """The stand-in's tag: a hash of the fake's files (package data) and the Dockerfile."""
    digest = hashlib.sha256(DOCKERFILE.encode())
    for name, data in _fake_files():
        digest.update(name.encode() + b"\0" + data)
    return f"{FAKE_REPO}:{digest.hexdigest()[:12]}"


def _build_context() -> io.BytesIO:
    dockerfile = DOCKERFILE.encode()
    files = [("Dockerfile", dockerfile)] + [(f"fakes/{name}", data) for name, data in _fake_files()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def ensure_fake_image(client: docker.DockerClient) -> str:
    """The fake server's image tag, building what is missing."""
    if not _has_image(client, BASE_TAG):
        build_base(client)
    tag = fake_tag()
    if not _has_image(client, tag):
        client.images.build(fileobj=_build_context(), custom_context=True, tag=tag, rm=True, pull=False)
        _prune_old_fakes(client, tag)
    return tag


def _prune_old_fakes(client: docker.DockerClient, keep: str) -> None:
    """Earlier builds of the fake are a few kB each on top of the base, but their tags pile up."""
    for image in client.images.list(name=FAKE_REPO):
        if keep not in image.tags:
            try:
                client.images.remove(image.id, force=False)
            except docker.errors.APIError:
                pass  # still used by a container: left for next time


if __name__ == "__main__":
    print(ensure_fake_image(docker.from_env()), file=sys.stdout)
