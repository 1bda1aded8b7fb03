"""The GPU-side stages of provision (image, p2p, serve, smoke), run from where gpunode runs.

Each works on the node's Docker engine through an SSH forward (gpunode.engine), with the
libraries behind `gpunode image`, `gpunode p2p`, `gpunode serve` and `gpunode smoke`. The Ansible
module `gpunode_stage` is a thin wrapper around ``run``: it returns what changed and why it failed.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from gpunode import plan
from gpunode.engine import Forward, docker_client, forward
from gpunode.hostfile import Host, SecretRef

P2P_OK = (0, 3)  # pass; pass with one GPU (pairs not applicable)


@dataclass
class StageResult:
    changed: bool = False
    failed: bool = False
    summary: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def _console(buffer: io.StringIO) -> Console:
    return Console(file=buffer, width=160, highlight=False, soft_wrap=True, color_system=None)


def _handoff(host: Host) -> Any:
    from gpunode.serve.spec import GpuHandoff

    gpus = host.container.gpus
    if host.container.gpu_handoff == "nvidia-runtime":
        return GpuHandoff.runtime(gpus)
    minors = gpus if gpus != "all" else []
    # The node stage proved these nodes exist in the container with the right numbers.
    paths = [f"/dev/nvidia{m}" for m in minors] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    return GpuHandoff.device_nodes(paths)


def image(host: Host, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.image import BuildError, VerifyError, build, verify

    tag = plan.image_tag(host.image)
    buffer = io.StringIO()
    if check_mode:
        client = docker_client(fw.docker_url)
        present = bool(client.images.list(name=tag))
        return StageResult(changed=not present, summary=[f"image {tag}: {'present' if present else 'would be built'}"])
    try:
        built = build(host.image, fw.docker_url, _console(buffer))
        report = verify(built.tag, list(plan.server_launch(host).argv), fw.docker_url)
    except (BuildError, VerifyError) as exc:
        return StageResult(failed=True, summary=[str(exc)], data={"log": buffer.getvalue()[-4000:]})
    lines = [f"image {built.tag}: {'built in %.0f s' % built.seconds if built.built else 'present, not rebuilt'}"]
    lines += [f"{'OK  ' if f.ok else 'FAIL'} {f.name}: {f.detail}" for f in report.findings]
    return StageResult(changed=built.built, failed=not report.ok, summary=lines,
                       data={"tag": built.tag, "built": built.built, "verify_ok": report.ok})


def _p2p_archive() -> bytes:
    """The gpunode.p2p package (stdlib + torch + nvidia-ml-py) as a tar for the server image."""
    package = Path(__file__).resolve().parent
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(package / "__init__.py", arcname="gpunode/__init__.py")
        for path in sorted((package / "p2p").glob("*.py")):
            tar.add(path, arcname=f"gpunode/p2p/{path.name}")
    return data.getvalue()


def p2p(host: Host, fw: Forward, check_mode: bool) -> StageResult:
    """Run `gpunode.p2p` inside the server image with the server's GPU hand-off."""

    if check_mode:
        return StageResult(summary=["p2p: measured only in a real run"])
    argv = list(plan.server_launch(host).argv)
    tp = argv[argv.index("--tp-size") + 1] if "--tp-size" in argv else "1"
    expect = host.p2p
    command = ["python3", "-m", "gpunode.p2p", "--json", "--min-gpus", tp,
               "--same-numa-gbps", str(expect.same_numa_gbps), "--cross-numa-gbps", str(expect.cross_numa_gbps),
               "--nvlink-gbps", str(expect.nvlink_gbps)] + ([] if expect.required else ["--not-required"])
    client = docker_client(fw.docker_url)
    # NVLink multicast off in any child environment (a shared host's GPUs can be put out of service).
    env = {"PYTHONPATH": "/opt/gpunode-src", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    container = client.containers.create(plan.image_tag(host.image), command=command, environment=env,
                                         ipc_mode="host", labels={"io.gpunode.role": "p2p-check"},
                                         **_handoff(host).docker_kwargs())
    try:
        _mkdir(container)
        container.put_archive("/opt/gpunode-src", _p2p_archive())
        container.start()
        code = int(container.wait(timeout=600).get("StatusCode", 1))
        output = container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        container.remove(force=True)
    try:
        report = json.loads(output)
    except ValueError:
        return StageResult(failed=True, summary=[f"p2p check exited {code} without a JSON report: {output[-500:]}"])
    verdict = report.get("verdict", {})
    lines = [f"p2p: {verdict.get('status')} (exit {code}): {verdict.get('summary', '')}"]
    lines += [f"{f.get('status', '').upper():4} {f.get('name', '')}: {f.get('detail', '')}" for f in verdict.get("findings", [])]
    return StageResult(failed=code not in P2P_OK, summary=lines, data={"exit_code": code, "verdict": verdict})


def _mkdir(container: Any) -> bool:
    # put_archive needs the target folder; an empty tar with it is the cheapest way to make it.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("opt/gpunode-src")
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
    return bool(container.put_archive("/", data.getvalue()))


def serve(host: Host, fw: Forward, check_mode: bool, timeout_s: float = 3600.0) -> StageResult:
    from gpunode.serve.command import run_serve

    if check_mode:
        return StageResult(summary=["serve: started only in a real run"])
    buffer = io.StringIO()
    outcome = run_serve(host, plan.image_tag(host.image), fw.docker_url, _console(buffer), timeout_s,
                        gpu_handoff=_handoff(host))
    action = outcome.start.action if outcome.start else "none"
    lines = [line for line in buffer.getvalue().splitlines() if line.strip()][-12:]
    return StageResult(changed=action in ("started", "created", "replaced"), failed=outcome.exit_code != 0,
                       summary=lines, data=outcome.as_dict())


def smoke(host: Host, fw: Forward, check_mode: bool) -> StageResult:

    from gpunode.smoke.bench import DockerBenchRunner
    from gpunode.smoke.command import smoke as run_smoke

    if check_mode:
        return StageResult(summary=["smoke: run only in a real run"])
    local = fw.ports[host.server.port]
    client = docker_client(fw.docker_url)
    runner = DockerBenchRunner(client, plan.image_tag(host.image), str(host.model.path))
    api_key = host.server.api_key.resolve() if host.server.api_key else None
    out = io.StringIO()
    code = run_smoke(f"http://127.0.0.1:{local}", host.served_name, api_key, runner, True, out)
    report = json.loads(out.getvalue())
    lines = [f"{c['status'].upper():4} {c['name']}: {c.get('detail', '')}" for c in report.get("checks", [])]
    return StageResult(failed=code != 0, summary=lines, data={"exit_code": code, "timings": report.get("timings")})


STAGE_RUNNERS = {"image": image, "p2p": p2p, "serve": serve, "smoke": smoke}


def run(stage: str, host: Host, api_key_file: str | None, check_mode: bool) -> StageResult:
    """Run one GPU-side stage for ``host`` on its node's engine (messages say no stage name: the
    module puts it in front)."""
    if api_key_file and host.server.api_key is not None:
        # The run's secret files stand in for env secrets, which are kept out of Ansible's environment.
        host = host.model_copy(update={"server": host.server.model_copy(update={"api_key": SecretRef(file=Path(api_key_file))})})
    import docker

    try:
        if stage == "image" and host.image.build_on == "local":
            return image(host, Forward(None, {}), check_mode)
        ports = (host.server.port,) if stage == "smoke" else ()
        with forward(host.container.reach, ports) as fw:
            return STAGE_RUNNERS[stage](host, fw, check_mode)
    except docker.errors.ImageNotFound:
        return StageResult(failed=True, summary=[
            f"the image {plan.image_tag(host.image)} is not on the node's engine: run the image stage "
            f"first (`gpunode provision --tags image`)"])
    except docker.errors.NotFound as exc:
        if "No such image" in str(exc):
            return StageResult(failed=True, summary=[
                f"the image {plan.image_tag(host.image)} is not on the node's engine: run the image stage "
                f"first (`gpunode provision --tags image`)"])
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
    except docker.errors.DockerException as exc:
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
