"""The monitor stage's GPU side: gpunode's NVML exporter (gpunode.stages.monitor.gpus) in a container
on the node, from the server's image (which holds prometheus_client and nvidia-ml-py: the stacks'
locks), with the server's GPU hand-off, listening on the node's loopback. The rest of the stage
(Debian's Prometheus, Alertmanager and node-exporter) is the role's.

The container is kept, started, made or replaced as the server's is (gpunode.stages.serve.docker_run,
by a hash of its settings and of gpunode's files put into it), and one of its name that gpunode did
not make is never touched.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

from gpunode.derive.monitorspec import EXPORTER_CONTAINER, EXPORTER_ROLE
from gpunode.derive.serverspec import LABEL_CONFIG, LABEL_HASH, LABEL_ROLE, canonical, config_hash
from gpunode.ground.result import StageResult
from gpunode.stages.common import Reach, Target, node_handoff
from gpunode.stages.engine import Forward, docker_client
from gpunode.stages.p2p.stage import archive as p2p_archive

IN_CONTAINER = "/opt/gpunode-src"
MONITOR_FILES = ("stages/monitor/__init__.py", "stages/monitor/gpus.py")


def archive() -> bytes:
    """The exporter and what it imports (the p2p package's NVML readers, stdlib only), as a tar to put
    at / in the container: everything under IN_CONTAINER."""
    package = Path(__file__).resolve().parents[2]
    root = IN_CONTAINER.lstrip("/")
    data = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(p2p_archive()), mode="r") as source, \
            tarfile.open(fileobj=data, mode="w") as tar:
        for depth in range(1, len(root.split("/")) + 1):
            folder = tarfile.TarInfo("/".join(root.split("/")[:depth]))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
        for member in source.getmembers():
            content = source.extractfile(member)
            member.name = f"{root}/{member.name}"
            tar.addfile(member, content)
        for name in MONITOR_FILES:
            tar.add(package / name, arcname=f"{root}/gpunode/{name}")
    return data.getvalue()


def files_digest(data: bytes) -> str:
    """sha256 over a tar's file names and contents (not their times or owners: a reinstall of the same
    gpunode is the same exporter)."""
    digest = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            extracted = tar.extractfile(member)
            digest.update(member.name.encode() + b"\0" + (extracted.read() if extracted else b"") + b"\0")
    return digest.hexdigest()


target_from_data = Target.from_data


def reach(target: Target) -> Reach:
    """The node's engine; the exporter's image there (the server's, shipped or built by the image stage)."""
    assert target.derived.monitor is not None
    return Reach(target.host.container.reach, (), target.derived.monitor.exporter_image)


def _image_env(client: Any, image: str) -> dict[str, str]:
    env = client.images.get(image).attrs.get("Config", {}).get("Env") or []
    return dict(item.split("=", 1) for item in env if "=" in item)


def spec(target: Target, client: Any, files: bytes) -> dict[str, Any]:
    """``containers.create`` kwargs: the exporter on the host's network (it listens on loopback), with
    gpunode's files (``files``, put in before it starts) first on the image's own PYTHONPATH,
    restarted with the engine."""
    plan = target.derived.monitor
    assert plan is not None
    path = _image_env(client, plan.exporter_image).get("PYTHONPATH", "")
    settings: dict[str, Any] = {
        "image": plan.exporter_image, "command": list(plan.exporter_command), "name": EXPORTER_CONTAINER,
        "environment": {"PYTHONPATH": ":".join(p for p in (IN_CONTAINER, path) if p), "PYTHONUNBUFFERED": "1"},
        "network_mode": "host", "restart_policy": {"Name": "unless-stopped"},
        "log_config": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}},
        **node_handoff(target.host, client).run_kwargs(),
    }
    # gpunode's files go in after the container is made: their digest is part of what is hashed, so a
    # gpunode whose exporter changed replaces the running one.
    hashed = {**settings, "gpunode_files": files_digest(files)}
    settings["labels"] = {LABEL_ROLE: EXPORTER_ROLE, LABEL_HASH: config_hash(hashed), LABEL_CONFIG: canonical(hashed)}
    return settings


def run(target: Target, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.catalogue.handoff import HandoffError
    from gpunode.stages.serve.docker_run import ServeError, decide, ensure_container

    plan = target.derived.monitor
    if plan is None:
        return StageResult(summary=["monitor: the host file has no monitor: section"])
    client = docker_client(fw.docker_url)
    files = archive()
    where = f"{EXPORTER_CONTAINER} on 127.0.0.1:{plan.exporter_port}"
    try:
        wanted = spec(target, client, files)
        if check_mode:
            decision = decide(client, wanted)
            return StageResult(changed=decision.action != "kept",
                               summary=[f"monitor: GPU exporter {where}: would be {decision.action} ({decision.reason})"])
        started = ensure_container(client, wanted, files=files, stop_timeout_s=10)
    except (HandoffError, ServeError) as exc:
        return StageResult(failed=True, summary=[f"monitor: {exc}"])
    return StageResult(changed=started.action != "kept",
                       summary=[f"monitor: GPU exporter {where}: {started.action} ({started.reason})"])
