"""Where the weights are, derived once from the host file's model: section: the folder that holds
the pinned revision, on which machine, what the container stage mounts, and what the model stage
checks (README "The model")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpunode.catalogue import profiles
from gpunode.ground.paths import PACKAGE
from gpunode.hostfile import Host

HUB = "https://huggingface.co"
# On the machine that holds the weights: the model stage's tools (a virtual environment with the
# hash-locked huggingface_hub and safetensors, and gpunode's model code beside it).
TOOLS_DIR = "/var/lib/gpunode/model-tools"
TOOLS_LOCK = PACKAGE / "stages" / "model" / "tools.lock"
# gpunode's files the tools run (stdlib and the two locked libraries only), relative to the package's parent.
TOOL_FILES = ("gpunode/__init__.py", "gpunode/ground/__init__.py", "gpunode/ground/exitcodes.py",
              "gpunode/ground/finding.py", "gpunode/stages/__init__.py", "gpunode/stages/model/__init__.py",
              "gpunode/stages/model/__main__.py", "gpunode/stages/model/manifest.py",
              "gpunode/stages/model/verify.py", "gpunode/stages/model/fetch.py")


class ModelPlan(BaseModel):
    """What the container, model and serve stages need of the model: computed here, once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["hub", "host_path", "node_path"]
    repo: str
    revision: str | None  # hub: the pinned commit
    endpoint: str | None  # hub: where it is fetched from
    on: Literal["host", "node"]  # which machine holds the weights: the Proxmox host or the GPU node
    weights_dir: str  # the folder holding them there
    manifest: str | None  # hub: the revision's file list with sizes and sha256, kept beside the folder
    mount_source: str | None  # the host folder bind-mounted read-only at mount_target (hub, host_path)
    mount_target: str  # where the container and the server see the weights (model.path)
    verify: Literal["full", "sizes"]
    workers: int
    tools_dir: str
    tools_lock: str  # on the controller: the tools' hash-locked requirements
    tool_files: tuple[tuple[str, str], ...]  # (on the controller, under tools_dir/lib there)
    architecture: str | None  # what config.json must name (the profile's)
    quantization: dict[str, str]


def repo_folder(repo: str) -> str:
    """The store's folder for a repo: its id with '/' as '--', as the Hub's own cache names it."""
    return repo.replace("/", "--")


def plan(host: Host) -> ModelPlan:
    model = host.model
    profile = profiles.load(host.profile_name)
    weights_dir, manifest, mount = str(model.path), None, None
    if model.source == "hub":
        assert model.store is not None and model.revision is not None  # the schema's rule
        base = model.store / repo_folder(model.id)
        weights_dir, manifest = str(base / model.revision), str(base / f"{model.revision}.manifest.json")
        mount = weights_dir
    elif model.source == "host_path":
        assert model.host_path is not None
        weights_dir = mount = str(model.host_path)
    return ModelPlan(
        source=model.source, repo=model.id, revision=model.revision,
        endpoint=(model.endpoint or HUB).rstrip("/") if model.source == "hub" else None,
        on="node" if model.source == "node_path" else "host", weights_dir=weights_dir, manifest=manifest,
        mount_source=mount, mount_target=str(model.path), verify=model.verify, workers=model.workers,
        tools_dir=TOOLS_DIR, tools_lock=str(TOOLS_LOCK),
        tool_files=tuple((str(PACKAGE.parent / rel), rel) for rel in TOOL_FILES), architecture=profile.architecture, quantization=dict(profile.quantization))
