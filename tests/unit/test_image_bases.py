"""The base catalog (images/sglang/bases.yml): names, mirrors, digests, locks per Python, toolchains."""

from __future__ import annotations

import pytest

from gpunode.hostfile import Image
from gpunode.catalogue import bases
from gpunode.catalogue import stacks
from gpunode.derive.imagecontext import LOCK, TOOLCHAIN_LOCK, collect_inputs, images_dir, lock_versions, version_matches

DEVEL = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
DIGEST = "sha256:" + "ab" * 32


def test_a_known_base_parses_plain_behind_a_mirror_and_pinned() -> None:
    plain = bases.parse(DEVEL)
    assert (plain.registry, plain.name, plain.digest, plain.pull_ref) == (None, DEVEL, None, DEVEL)
    mirrored = bases.parse(f"127.0.0.1:5000/{DEVEL}@{DIGEST}")
    assert (mirrored.registry, mirrored.name, mirrored.digest) == ("127.0.0.1:5000", DEVEL, DIGEST)
    assert mirrored.tag_ref == f"127.0.0.1:5000/{DEVEL}"
    assert bases.parse("localhost/ubuntu:24.04").registry == "localhost"


@pytest.mark.parametrize(("text", "message"), [
    ("nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04", "unknown base 'nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04'"),
    (f"{DEVEL}@sha256:abc", "a digest is sha256:<64 lowercase hex>"),
    ("registry.example/debootstrap", "debootstrap is made on this machine"),
    ("mirror/ubuntu:24.04", "unknown base 'mirror/ubuntu:24.04'"),  # no dot, no port: not a registry
])
def test_a_bad_base_is_named(text: str, message: str) -> None:
    with pytest.raises(bases.BaseRefError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("*", r"\*")):
        bases.parse(text)


def test_the_host_file_refuses_an_unknown_base() -> None:
    with pytest.raises(ValueError, match="unknown base 'nvidia/cuda:latest'"):
        Image(base="nvidia/cuda:latest")


def test_the_default_base_carries_cuda_12_8s_toolchain() -> None:
    toolchain = bases.toolchain_for(Image().base_name, "base")
    assert Image().base is None and Image().base_name == DEVEL
    assert toolchain is not None and (toolchain.cuda, toolchain.cuda_home, toolchain.lab_only) == ("12.8", "/usr/local/cuda", False)
    assert bases.toolchain_for("debootstrap", "base") is None
    assert bases.toolchain_for("debootstrap", "pypi-cuda-13.0").lab_only


@pytest.mark.parametrize("name", list(bases.bases()))
@pytest.mark.parametrize("stack", stacks.available())
def test_every_stack_has_a_lock_for_each_bases_python(name: str, stack: str) -> None:
    base, held = bases.bases()[name], stacks.load(stack)
    lock_name = held.lock_for(base.python)
    assert lock_name is not None, f"stack {stack} has no lock for Python {base.python} (base {name})"
    versions = lock_versions((held.folder / lock_name).read_text())
    # The same versions hold for each interpreter's lock: the stack's pins.
    assert all(version_matches(pin.version, versions.get(dist)) for pin in held.pins.values() for dist in pin.distributions)
    assert {"3.11": "requirements.lock", "3.12": "requirements-py312.lock"}[base.python] == lock_name


def test_the_build_context_takes_the_bases_lock_under_one_name() -> None:
    bookworm = collect_inputs(Image(base="debootstrap"))
    noble = collect_inputs(Image(base="ubuntu:24.04"))
    seeds = stacks.load(stacks.DEFAULT).folder
    assert bookworm.files[LOCK] == (seeds / "requirements.lock").read_bytes()
    assert noble.files[LOCK] == (seeds / "requirements-py312.lock").read_bytes()
    assert TOOLCHAIN_LOCK not in bookworm.files


def test_the_pypi_toolchain_lock_is_cuda_13_0_and_hashed() -> None:
    lock = (images_dir() / "toolchain-cuda13.0.lock").read_text()
    versions = lock_versions(lock)
    assert versions["cuda-toolkit"] == "13.0.2" and versions["nvidia-cuda-nvcc"].startswith("13.0.")
    assert lock.count("--hash=sha256:") >= len(versions)


def test_a_registry_base_gets_its_packages_and_the_toolchain_on_path() -> None:
    inputs = collect_inputs(Image(base=DEVEL))
    assert inputs.dockerfile.splitlines()[1] == f"FROM {DEVEL}"
    assert "apt-get install -y --no-install-recommends python3 python3-venv" in inputs.dockerfile
    assert "ENV CUDA_HOME=/usr/local/cuda" in inputs.dockerfile
    assert ":/usr/local/cuda/bin\n" in inputs.dockerfile


def test_a_pinned_base_is_built_from_its_digest() -> None:
    inputs = collect_inputs(Image(base=f"{DEVEL}@{DIGEST}"))
    assert f"FROM {DEVEL}@{DIGEST}\n" in inputs.dockerfile
    assert inputs.tag != collect_inputs(Image(base=DEVEL)).tag
