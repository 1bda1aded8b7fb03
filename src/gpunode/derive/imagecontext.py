"""What goes into the server image: the rendered Dockerfile, the files beside it, and the tag.

The tag is derived from exactly the bytes the build sends to Docker (the build context: rendered
Dockerfile, the stack's lock and patches, the optional CA bundle) plus the base. Equal inputs give an equal tag,
and a tag that already exists on the engine is not built again. This is the one definition of the
image tag; ``gpunode.derive.plan`` should call :func:`image_tag`.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import jinja2

from gpunode.hostfile import Image
from gpunode.catalogue import stacks
from gpunode.catalogue import bases
from gpunode.catalogue.aot import AotPlan, modules_json
from gpunode.catalogue.patches import PatchFormatError, parse_patch
from gpunode.ground.paths import IMAGES

VENV = "/opt/sglang"
# 2026-02-24T00:00:00Z, the resolution cut-off of lock.sh: a fixed time for hash-based .pyc files.
SOURCE_DATE_EPOCH = 1771891200
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CA_IN_CONTEXT = "extra-ca.crt"
TEMPLATE = "Dockerfile.j2"
LOCK = "requirements.lock"  # the context name of the base's lock, whichever Python it is for
TOOLCHAIN_LOCK = "toolchain.lock"
AOT_SCRIPT = "flashinfer_aot.py"
AOT_BUILDER = f"/opt/gpunode/{AOT_SCRIPT}"  # in the image: builds the modules, and gives verify their specs
TOOLCHAIN_VENV = "/opt/cuda-toolchain"
PIP_LOCK = "pip.lock"
BASE_PACKAGES = "base-packages.txt"
PATCHES = stacks.PATCHES
LABEL_PREFIX = "org.gpunode"


class ImageInputError(ValueError):
    """The inputs of the image are inconsistent (lock vs pins, a missing file)."""


def images_dir() -> Path:
    return IMAGES / "sglang"


def stack_of(image: Image, folder: Path | None = None) -> stacks.Stack:
    """The image's stack, from ``folder``'s stacks (default: the package's)."""
    return stacks.load(image.stack, (folder or images_dir()) / "stacks")


def version_matches(pin: str, version: str | None) -> bool:
    """``12.8`` matches ``12.8.93``; ``2.9.1`` matches only ``2.9.1`` (and local tags like ``+cu128``)."""
    if version is None:
        return False
    public = version.split("+", 1)[0]
    return public == pin or public.startswith(pin + ".")


def expected_versions(pins: Mapping[str, str], stack: stacks.Stack) -> dict[str, str]:
    """Distribution name -> the pin it must match (the stack says which distributions carry a pin;
    a pin ending in a minor version, cuda 12.8, matches any patch release, 12.8.93)."""
    return {dist: pins[pin] for pin, entry in stack.pins.items() for dist in entry.distributions}


_LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_versions(lock_text: str) -> dict[str, str]:
    """``name==version`` lines of a pip requirements lock, names normalized (PEP 503)."""
    return {normalize(name): version for name, version in _LOCK_LINE.findall(lock_text)}


def lock_pin_mismatches(lock_text: str, pins: Mapping[str, str], stack: stacks.Stack) -> list[str]:
    """One line per pinned distribution whose locked version differs from the host file's pin."""
    locked = lock_versions(lock_text)
    problems = []
    for dist, pin in expected_versions(pins, stack).items():
        found = locked.get(normalize(dist))
        if not version_matches(pin, found):
            problems.append(f"{dist}: the lock has {found or 'nothing'}, the pins say {pin}")
    return problems


def read_base_packages(text: str) -> list[str]:
    """Package names of base-packages.txt: one per line, # comments."""
    names = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [name for name in names if name]


@dataclass(frozen=True)
class DebootstrapBase:
    """A base made locally: ``debootstrap --variant=minbase`` plus packages, then ``docker import``."""

    packages: tuple[str, ...]
    suite: str = DEBIAN_SUITE
    mirror: str = DEBIAN_MIRROR
    variant: str = "minbase"

    @property
    def ref(self) -> str:
        spec = "\0".join([self.suite, self.variant, self.mirror, *sorted(self.packages)])
        return f"gpunode/base:{self.suite}-{self.variant}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def patch_targets(files: dict[str, bytes]) -> dict[str, list[str]]:
    """Patch name -> files it changes, for the patches among the context files (in name order)."""
    targets = {}
    for path in sorted(files):
        if path.startswith(PATCHES + "/"):
            name = path.split("/", 1)[1]
            try:
                targets[name] = list(parse_patch(name, files[path].decode()).added_blocks)
            except PatchFormatError as exc:
                raise ImageInputError(str(exc)) from None
    return targets


def pin_labels(pins: Mapping[str, str], stack: str) -> dict[str, str]:
    labels = {f"{LABEL_PREFIX}.pin.{name}": value for name, value in pins.items()}
    labels[f"{LABEL_PREFIX}.stack"] = stack
    labels[f"{LABEL_PREFIX}.venv"] = VENV
    return labels


@dataclass(frozen=True)
class BuildContext:
    """What a build sends to Docker: the rendered Dockerfile and the files beside it. An image's
    content tag is made from these bytes (the server image's, and the router's)."""

    dockerfile: str
    files: dict[str, bytes]  # context path -> content, besides the Dockerfile

    def digest(self) -> str:
        digest = hashlib.sha256()
        for path, content in sorted({"Dockerfile": self.dockerfile.encode(), **self.files}.items()):
            digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
        return digest.hexdigest()


@dataclass(frozen=True)
class BuildInputs(BuildContext):
    """Everything one server image build needs, read once: the tag is computed from these bytes alone."""

    base_ref: str
    debootstrap: DebootstrapBase | None
    patches: tuple[str, ...]
    pins: Mapping[str, str]
    name: str
    stack: stacks.Stack
    lock_problems: tuple[str, ...] = field(default=())
    toolchain: bases.Toolchain | None = None
    aot: AotPlan | None = None

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.pins['sglang']}-cu{self.pins['cuda'].replace('.', '')}-{self.digest()[:12]}"


def render_dockerfile(template_text: str, *, base_ref: str, apt_packages: list[str], ca_bundle: str | None,
                      patches: dict[str, list[str]], labels: dict[str, str],
                      toolchain: bases.Toolchain | None = None, aot: AotPlan | None = None) -> str:
    """``patches``: patch file name -> the files it changes (relative to site-packages), in order.
    ``toolchain``: the CUDA toolchain's home goes on PATH (and one from PyPI is installed);
    ``aot``: one build step per module group."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=False, autoescape=False)
    pip_env = "PIP_CERT=/etc/ssl/certs/ca-certificates.crt " if ca_bundle else ""
    groups = [{"name": name, "modules": [m.name for m in modules], "json": modules_json(modules)}
              for name, modules in (aot.groups() if aot else [])]
    return env.from_string(template_text).render(
        base_ref=base_ref, apt_packages=apt_packages, ca_bundle=ca_bundle, patches=list(patches),
        patch_targets=patches, labels=labels,
        venv=VENV, pip_env=pip_env, source_date_epoch=SOURCE_DATE_EPOCH,
        toolchain=toolchain, toolchain_venv=TOOLCHAIN_VENV, toolchain_lock=TOOLCHAIN_LOCK if toolchain and toolchain.lock else None,
        aot_groups=groups, aot_script=AOT_SCRIPT, aot_builder=AOT_BUILDER, cuda_arch=aot.arch.cuda_arch if aot else "",
    )


def _read(folder: Path, name: str) -> bytes:
    path = folder / name
    if not path.is_file():
        raise ImageInputError(f"{path} is missing")
    return path.read_bytes()


def collect_inputs(image: Image, folder: Path | None = None, aot: AotPlan | None = None) -> BuildInputs:
    """Read images/sglang/ (or ``folder``), the image's stack there and the host file's image
    section into build inputs; ``aot`` (gpunode.derive.aot_plan of the host) adds the FlashInfer
    modules built ahead of time."""
    folder = folder or images_dir()
    stack = stack_of(image, folder)
    packages = read_base_packages(_read(folder, BASE_PACKAGES).decode())
    base = bases.parse(image.base_name)
    debootstrap = DebootstrapBase(tuple(packages)) if base.local else None
    base_ref = debootstrap.ref if debootstrap else base.pull_ref
    python = bases.base_of(image.base_name).python
    toolchain = bases.toolchain_for(image.base_name, image.toolchain, stack.toolchain)
    if aot is not None and not aot.modules:
        aot = None
    if aot is not None and toolchain is None:
        raise ImageInputError(f"FlashInfer modules ahead of time need a CUDA toolchain, and base {image.base_name} has none")
    lock = stack.lock_for(python)
    if lock is None:
        raise ImageInputError(f"stack {stack.name} has no lock for Python {python}, the Python of base {base.name} "
                              f"(it has {', '.join(stack.locks)})")
    patches = stack.patch_names()
    files = {LOCK: _read(stack.folder, lock), PIP_LOCK: _read(folder, PIP_LOCK)}
    if toolchain is not None and toolchain.lock:
        files[TOOLCHAIN_LOCK] = _read(folder, toolchain.lock)
    if aot is not None:
        files[AOT_SCRIPT] = _read(folder, AOT_SCRIPT)
    files.update({f"{PATCHES}/{name}": _read(stack.folder, f"{PATCHES}/{name}") for name in patches})
    if image.ca_bundle is not None:
        if not image.ca_bundle.is_file():
            raise ImageInputError(f"image.ca_bundle {image.ca_bundle} is not a readable file")
        files[CA_IN_CONTEXT] = image.ca_bundle.read_bytes()
    pins = image.pinned()
    dockerfile = render_dockerfile(
        _read(folder, TEMPLATE).decode(), base_ref=base_ref,
        apt_packages=[] if debootstrap else packages,
        ca_bundle=CA_IN_CONTEXT if image.ca_bundle is not None else None,
        patches=patch_targets(files), labels=pin_labels(pins, stack.name), toolchain=toolchain, aot=aot,
    )
    problems = lock_pin_mismatches(files[LOCK].decode(), pins, stack)
    return BuildInputs(dockerfile=dockerfile, files=files, base_ref=base_ref, debootstrap=debootstrap,
                       patches=tuple(patches), pins=pins, name=image.name, stack=stack, lock_problems=tuple(problems),
                       toolchain=toolchain, aot=aot)


def image_tag(image: Image, folder: Path | None = None, aot: AotPlan | None = None) -> str:
    """The content tag of the image the host file asks for, e.g. ``gpunode/sglang:0.5.9-cu128-<12 hex>``."""
    return collect_inputs(image, folder, aot).tag


def context_tar(inputs: BuildContext) -> bytes:
    """The build context as a tar with fixed owners and times, so it depends on content alone."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content in sorted({"Dockerfile": inputs.dockerfile.encode(), **inputs.files}.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), 0o644, SOURCE_DATE_EPOCH
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()
