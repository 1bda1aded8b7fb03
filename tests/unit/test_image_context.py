"""Template rendering, tag derivation and the lock-vs-pins check of gpunode.derive.imagecontext."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpunode.catalogue import stacks
from gpunode.hostfile import Image, ImagePins
from gpunode.derive.imagecontext import (
    CA_IN_CONTEXT,
    DebootstrapBase,
    ImageInputError,
    collect_inputs,
    context_tar,
    image_tag,
    images_dir,
    lock_pin_mismatches,
    lock_versions,
    read_base_packages,
    version_matches,
)

SEEDS = stacks.load(stacks.DEFAULT)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A private copy of images/sglang to change freely."""
    copy = tmp_path / "sglang"
    shutil.copytree(images_dir(), copy)
    return copy


def test_version_matches_exact_and_minor_prefix() -> None:
    assert version_matches("2.9.1", "2.9.1")
    assert version_matches("2.9.1", "2.9.1+cu128")
    assert version_matches("12.8", "12.8.93")
    assert not version_matches("12.8", "12.9.1")
    assert not version_matches("2.9.1", "2.9.10")
    assert not version_matches("0.5.9", None)


def test_lock_versions_reads_names_normalized() -> None:
    text = "Flashinfer_Python==0.6.3 \\\n    --hash=sha256:ab\ntorch==2.9.1 ; sys_platform == 'linux'\n# x==1\n"
    assert lock_versions(text) == {"flashinfer-python": "0.6.3", "torch": "2.9.1"}


def test_shipped_lock_holds_the_default_pins() -> None:
    lock = (SEEDS.folder / "requirements.lock").read_text()
    assert lock_pin_mismatches(lock, SEEDS.versions(), SEEDS) == []
    assert "--hash=sha256:" in lock


def test_lock_pin_mismatch_names_the_distribution() -> None:
    lock = (SEEDS.folder / "requirements.lock").read_text()
    problems = lock_pin_mismatches(lock, {**SEEDS.versions(), "sglang": "0.5.8", "cuda": "12.9"}, SEEDS)
    assert "sglang: the lock has 0.5.9, the pins say 0.5.8" in problems
    assert any(p.startswith("nvidia-cuda-runtime-cu12: the lock has 12.8.") for p in problems)


def test_every_lock_line_is_hashed() -> None:
    lock = (SEEDS.folder / "requirements.lock").read_text()
    for block in lock.split("\n"):
        if "==" in block and not block.startswith((" ", "#")):
            assert block.endswith("\\"), f"no hash after {block}"


def test_base_packages_skip_comments() -> None:
    assert read_base_packages("# x\npython3  # why\n\ngcc\n") == ["python3", "gcc"]


def test_debootstrap_base_ref_follows_its_spec() -> None:
    one = DebootstrapBase(("gcc", "python3"))
    assert one.ref.startswith("gpunode/base:bookworm-minbase-")
    assert one.ref == DebootstrapBase(("python3", "gcc")).ref  # order does not matter
    assert one.ref != DebootstrapBase(("python3",)).ref


def test_render_debootstrap_base_has_no_apt_step() -> None:
    inputs = collect_inputs(Image(base="debootstrap"))
    assert inputs.dockerfile.startswith("# Rendered by gpunode.image")
    assert f"FROM {inputs.base_ref}\n" in inputs.dockerfile
    assert "apt-get" not in inputs.dockerfile
    assert "--require-hashes --no-deps --only-binary=:all:" in inputs.dockerfile
    assert "PIP_CERT" not in inputs.dockerfile and CA_IN_CONTEXT not in inputs.files
    assert 'org.gpunode.pin.transformers="5.2.0"' in inputs.dockerfile
    assert "{{" not in inputs.dockerfile and "{%" not in inputs.dockerfile


def test_render_registry_base_installs_base_packages() -> None:
    inputs = collect_inputs(Image(base="debian:bookworm-slim"))
    assert inputs.debootstrap is None
    assert "FROM debian:bookworm-slim\n" in inputs.dockerfile
    assert "apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++" in inputs.dockerfile


def test_ca_bundle_goes_into_context_and_tag(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    inputs = collect_inputs(Image(base="debootstrap", ca_bundle=ca))
    assert inputs.files[CA_IN_CONTEXT] == ca.read_bytes()
    assert "update-ca-certificates" in inputs.dockerfile
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install" in inputs.dockerfile
    tag_one = inputs.tag
    ca.write_text("other")
    assert image_tag(Image(base="debootstrap", ca_bundle=ca)) != tag_one != image_tag(Image(base="debootstrap"))


def test_missing_ca_bundle_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(ImageInputError, match="ca_bundle"):
        collect_inputs(Image(base="debootstrap", ca_bundle=tmp_path / "nope.pem"))


def test_patches_render_one_step_each_in_name_order(folder: Path) -> None:
    (folder / "stacks" / stacks.DEFAULT / "patches" / "0000-first.patch").write_text((folder / "stacks" / stacks.DEFAULT / "patches").glob("*.patch").__next__().read_text())
    inputs = collect_inputs(Image(base="debootstrap"), folder)
    assert inputs.patches[0] == "0000-first.patch"
    first, second = (inputs.dockerfile.index(f"COPY patches/{p}") for p in inputs.patches[:2])
    assert first < second
    assert inputs.dockerfile.index("requirements.lock") < first  # patches after the big layer


def test_tag_is_stable_and_follows_content(folder: Path) -> None:
    base = image_tag(Image(base="debootstrap"), folder)
    assert base == image_tag(Image(base="debootstrap"), folder)
    assert base.startswith("gpunode/sglang:0.5.9-cu128-")
    (folder / "README.md").write_text("docs do not change the image")
    assert image_tag(Image(base="debootstrap"), folder) == base
    for change, extra in ((f"stacks/{stacks.DEFAULT}/requirements.lock", b"# changed"), ("Dockerfile.j2", b"# changed"),
                          ("base-packages.txt", b"htop"), ("pip.lock", b"# changed")):
        path = folder / change
        original = path.read_bytes()
        path.write_bytes(original + b"\n" + extra + b"\n")
        assert image_tag(Image(base="debootstrap"), folder) != base, change
        path.write_bytes(original)
    (folder / "stacks" / stacks.DEFAULT / "patches" / "0002-more.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert image_tag(Image(base="debootstrap"), folder) != base


def test_tag_follows_base_pins_and_name() -> None:
    base = image_tag(Image(base="debootstrap"))
    assert image_tag(Image(base="debian:bookworm-slim")) != base
    assert image_tag(Image(pins=ImagePins(transformers="5.3.0"))) != base
    assert image_tag(Image(name="site/sglang")).startswith("site/sglang:0.5.9-cu128-")


def test_context_tar_is_deterministic() -> None:
    inputs = collect_inputs(Image(base="debootstrap"))
    assert context_tar(inputs) == context_tar(collect_inputs(Image(base="debootstrap")))


def test_patch_step_recompiles_the_files_it_changes() -> None:
    dockerfile = collect_inputs(Image(base="debootstrap")).dockerfile
    assert "python3 -m compileall -q -f sglang/srt/model_executor/model_runner.py" in dockerfile
    assert 'echo "gpunode: patch 0001-flashinfer-autotune-cutlass.patch does not apply' in dockerfile


def test_unparseable_patch_is_an_input_error(folder: Path) -> None:
    (folder / "stacks" / stacks.DEFAULT / "patches" / "0009-notes.patch").write_text("only words\n")
    with pytest.raises(ImageInputError, match="0009-notes.patch: no '\\+\\+\\+ b/<path>' header"):
        collect_inputs(Image(base="debootstrap"), folder)
