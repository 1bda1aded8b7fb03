"""Build the server image through the Docker SDK, on the local engine or a remote one (ssh://).

An image whose content tag already exists on the engine is not built again. The build streams
Docker's output into a rich display: the current step, pip's download progress, the last lines.
"""

from __future__ import annotations

import io
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import docker
from docker.errors import APIError, DockerException
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gpunode.hostfile import Image
from gpunode.catalogue import bases
from gpunode.catalogue.aot import AotPlan, modules_json
from gpunode.stages.image.base import BaseDigest, BaseError, ensure_debootstrap_base, ensure_registry_base, image_exists
from gpunode.derive.imagecontext import LABEL_PREFIX, BuildContext, BuildInputs, ImageInputError, collect_inputs, context_tar

# A cold build downloads ~4 GB of wheels, and a build step streams nothing until it ends: FlashInfer's
# MoE module alone is about half an hour of one step on 2 cores, ~8 min on 8 (benchmarks/aot_build.py).
BUILD_TIMEOUT_S = 4 * 3600


class BuildError(RuntimeError):
    """The image could not be built; the message names the step (and the patch) that failed."""


@dataclass(frozen=True)
class BuildResult:
    tag: str
    built: bool
    seconds: float
    base: str = ""
    image_id: str = ""
    base_digest: BaseDigest | None = None


def docker_client(engine_url: str | None) -> docker.DockerClient:
    """The local engine (DOCKER_HOST or the default socket) or ``engine_url`` (tcp://, unix://, ssh://)."""
    try:
        if engine_url is None:
            return docker.from_env(timeout=BUILD_TIMEOUT_S)
        # ssh:// through the system ssh client: no paramiko dependency, and ~/.ssh/config applies.
        return docker.DockerClient(base_url=engine_url, timeout=BUILD_TIMEOUT_S,
                                   use_ssh_client=engine_url.startswith("ssh://"))
    except DockerException as exc:
        raise BuildError(f"cannot reach the Docker engine {engine_url or '(local)'}: {exc}") from None


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)")
_PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([^)]+)\))?")
_PATCH_STEP = re.compile(r"patches/(\S+\.patch)")
_NOTABLE = re.compile(r"^(Step \d|\s*Downloading |Successfully |gpunode: |ERROR|error|Installing collected)")


class BuildDisplay:
    """Turns Docker's build stream into a step bar, a download bar and notable lines."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.tail: deque[str] = deque(maxlen=40)
        self.step = ""
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.steps: TaskID = self.progress.add_task("steps", total=None)
        self.download: TaskID | None = None

    def __enter__(self) -> BuildDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def line(self, text: str) -> None:
        text = text.rstrip()
        if not text.strip():
            return
        self.tail.append(text)
        if step := _STEP.match(text):
            self.step = text
            self.progress.update(self.steps, completed=int(step[1]) - 1, total=int(step[2]),
                                 description=f"step {step[1]}/{step[2]}")
        if progress := _PIP_PROGRESS.match(text):
            self._download_progress(int(progress[1]), int(progress[2]))
            return  # hundreds of these per wheel: shown as a bar, not as lines
        if downloading := _PIP_DOWNLOADING.match(text):
            self._new_download(Path(downloading[1]).name)
        if _NOTABLE.match(text):
            self.progress.console.print(text[:200], markup=False, highlight=False)

    def _new_download(self, name: str) -> None:
        if self.download is not None:
            self.progress.remove_task(self.download)
        self.download = self.progress.add_task(f"  {name[:60]}", total=None)

    def _download_progress(self, done: int, total: int) -> None:
        if self.download is not None:
            self.progress.update(self.download, completed=done, total=total)

    def failure(self, error: str) -> str:
        """The message of a failed build: which step, which patch if a patch step, the last lines."""
        patch = _PATCH_STEP.search(self.step)
        what = f"patch {patch[1]} does not apply" if patch else f"build failed at {self.step or 'the start'}"
        return f"{what}: {error.strip()}\n--- last build output ---\n" + "\n".join(self.tail)


def build_labels(inputs: BuildInputs, base_digest: BaseDigest | None) -> dict[str, str]:
    """Facts of this build that are not inputs of the tag: the base's digest as pulled (a moving
    tag's content), and what ``image verify`` should find (toolchain, arch, modules ahead of time)."""
    labels = {f"{LABEL_PREFIX}.base": inputs.base_ref.split("@", 1)[0]}
    if base_digest is not None and base_digest.digest:
        labels[f"{LABEL_PREFIX}.base.digest"] = base_digest.digest
    if inputs.toolchain is not None:
        labels[f"{LABEL_PREFIX}.toolchain"] = inputs.toolchain.name
        labels[f"{LABEL_PREFIX}.toolchain.cuda"] = inputs.toolchain.cuda
    if inputs.aot is not None:
        labels[f"{LABEL_PREFIX}.aot.arch"] = inputs.aot.arch.cuda_arch
        labels[f"{LABEL_PREFIX}.aot.modules"] = modules_json(list(inputs.aot.modules))
    return labels


def stream_build(client: docker.DockerClient, inputs: BuildContext, tag: str, display: BuildDisplay,
                 labels: dict[str, str] | None = None) -> str:
    """Run the build; returns the image id. Intermediate containers are removed even on failure."""
    chunks: Iterable[dict[str, Any]] = client.api.build(
        fileobj=io.BytesIO(context_tar(inputs)), custom_context=True, tag=tag, rm=True, forcerm=True,
        decode=True, pull=False, timeout=BUILD_TIMEOUT_S, labels=labels or None,
    )
    image_id = ""
    for chunk in chunks:
        for text in chunk.get("stream", "").splitlines():
            display.line(text)
        if "error" in chunk:
            raise BuildError(display.failure(chunk["error"]))
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
    return image_id


def build(image: Image, engine_url: str | None = None, console: Console | None = None, *,
          folder: Path | None = None, force: bool = False, aot: AotPlan | None = None) -> BuildResult:
    """Build the image the host file asks for unless its content tag already exists on the engine.
    ``aot``: the FlashInfer modules to build ahead of time (gpunode.derive.aot_plan of the host)."""
    console = console or Console(stderr=True)
    started = time.monotonic()
    try:
        inputs = collect_inputs(image, folder, aot)
    except ImageInputError as exc:
        raise BuildError(str(exc)) from None
    if inputs.lock_problems:
        raise BuildError(f"the lock of stack {inputs.stack.name} does not hold the host file's pins (re-lock with "
                         "images/sglang/lock.sh after editing its requirements.in):\n  " + "\n  ".join(inputs.lock_problems))
    tag = inputs.tag
    client = docker_client(engine_url)
    try:
        if image_exists(client, tag) and not force:
            console.print(f"image {tag}: present, not rebuilt")
            return BuildResult(tag, False, time.monotonic() - started, inputs.base_ref, client.images.get(tag).id)
        base_digest = None
        if inputs.debootstrap is not None:
            ensure_debootstrap_base(client, inputs.debootstrap, console)
        else:
            base_digest = ensure_registry_base(client, bases.parse(image.base_name), console)
        console.print(f"image {tag}: building from {inputs.base_ref}")
        with BuildDisplay(console) as display:
            image_id = stream_build(client, inputs, tag, display, build_labels(inputs, base_digest))
    except (APIError, DockerException, BaseError) as exc:
        raise BuildError(f"building {tag}: {exc}") from None
    finally:
        client.close()
    seconds = time.monotonic() - started
    console.print(f"image {tag}: built in {seconds:.0f} s")
    return BuildResult(tag, True, seconds, inputs.base_ref, image_id, base_digest)
