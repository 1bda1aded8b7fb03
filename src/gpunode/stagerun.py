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


def _handoff(host: Host, client: Any) -> Any:
    """The hand-off the node stage set up: its CDI spec (through Docker's CDI, or read from the
    node and given as explicit devices and mounts), or NVIDIA's runtime."""
    from gpunode.engine import read_file
    from gpunode.serve import docker_run

    info = client.info()
    spec = None
    if host.container.gpu_handoff == "host-driver" and not docker_run.cdi_enabled(info):
        text = read_file(host.container.reach, docker_run.CDI_SPEC_FILE)
        spec = json.loads(text) if text else None
    return docker_run.choose_gpu_handoff(info, host.container.gpus, local=False,
                                         configured=host.container.gpu_handoff, cdi_spec=spec)


def _image_record(tag: str, image_id: str | None, verified: bool | None, failed: list[str], note: str = "") -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/image.json for `gpunode check` (stable across runs)."""
    return {"tag": tag, "id": image_id, "verified": verified, "failed": failed, "note": note}


def _stand_in_image(host: Host, fw: Forward, check_mode: bool) -> StageResult:
    """Lab: put the fake server's image (built here by `gpunode lab up`) on the node's engine."""
    from gpunode.image.ship import image_id, ship

    tag = plan.server_image(host)
    here = docker_client(None)
    local = image_id(here, tag)
    if local is None:
        return StageResult(failed=True, summary=[f"the lab's stand-in image {tag} is not on this machine's engine: "
                                                 "run `gpunode lab up`"])
    node = docker_client(fw.docker_url)
    present = image_id(node, tag) == local
    note = "lab stand-in (fake SGLang server): pins and sm_120 kernels apply to the real image (`gpunode image verify`)"
    if check_mode:
        return StageResult(changed=not present, summary=[f"stand-in {tag}: {'on the node' if present else 'would be shipped'}"])
    shipped = ship(here, node, tag)
    return StageResult(changed=shipped, summary=[f"stand-in {tag}: {'shipped to the node' if shipped else 'on the node'}",
                                                 f"not verified: {note}"],
                       data={"tag": tag, "record": _image_record(tag, local, None, [], note)})


def image(host: Host, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.image import BuildError, VerifyError, build, verify
    from gpunode.image.ship import image_id, ship

    if host.image.lab_stand_in:
        return _stand_in_image(host, fw, check_mode)
    tag = plan.image_tag(host)
    local = host.image.build_on == "local"
    node = docker_client(fw.docker_url)
    buffer = io.StringIO()
    if check_mode:
        present = image_id(node, tag) is not None
        return StageResult(changed=not present, summary=[f"image {tag}: {'present' if present else 'would be built'}"])
    try:
        aot = plan.aot_plan(host)
        built = build(host.image, None if local else fw.docker_url, _console(buffer), aot=aot)
        report = verify(built.tag, list(plan.server_launch(host).argv), None if local else fw.docker_url, aot=aot)
    except (BuildError, VerifyError) as exc:
        return StageResult(failed=True, summary=[str(exc)], data={"log": buffer.getvalue()[-4000:]})
    lines = [f"image {built.tag}: {'built in %.0f s' % built.seconds if built.built else 'present, not rebuilt'}"]
    lines += [f"{'OK  ' if f.ok else 'FAIL'} {f.name}: {f.detail}" for f in report.findings]
    shipped = False
    if local and report.ok:
        # Built here: the node's engine is where the server runs it.
        shipped = ship(docker_client(None), node, built.tag)
        lines.append(f"image {built.tag}: {'shipped to the node' if shipped else 'already on the node'}")
    record = _image_record(built.tag, image_id(node, built.tag), report.ok,
                           [f.name for f in report.findings if not f.ok])
    return StageResult(changed=built.built or shipped, failed=not report.ok, summary=lines,
                       data={"tag": built.tag, "built": built.built, "verify_ok": report.ok, "record": record})


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
    container = client.containers.create(plan.image_tag(host), command=command, environment=env,
                                         ipc_mode="host", labels={"io.gpunode.role": "p2p-check"},
                                         **_handoff(host, client).run_kwargs())
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
    lines += [_finding_line(f) for f in verdict.get("findings", [])]
    return StageResult(failed=code not in P2P_OK, summary=lines, data={"exit_code": code, "verdict": verdict,
                                                                       "record": p2p_record(host.container.gpus, code, verdict)})


def _finding_line(finding: dict[str, Any]) -> str:
    return f"{finding['severity'].upper():4} {finding['subject']} {finding['code']}: {finding['message']}"


def p2p_record(gpus: str | list[int], code: int, verdict: dict[str, Any]) -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/p2p.json for `gpunode check`: the verdict, no timings
    (the check asks "did it pass, for these GPUs", not the numbers, which `gpunode p2p` reports)."""
    return {"gpus": gpus, "ok": code in P2P_OK, "exit_code": code, "status": verdict.get("status"),
            "summary": verdict.get("summary", ""),
            "failed": [_finding_line(f) for f in verdict.get("findings", []) if f["severity"] == "fail"]}


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
    from gpunode.serve.docker_run import ServeError

    if check_mode:
        return StageResult(summary=["serve: started only in a real run"])
    buffer = io.StringIO()
    try:
        settings, notes = node_serve_settings(host, fw.docker_url)
    except ServeError as exc:
        return StageResult(failed=True, summary=[f"serve: {exc}"])
    outcome = run_serve(host, plan.server_image(host), fw.docker_url, _console(buffer), timeout_s, **settings)
    action = outcome.start.action if outcome.start else "none"
    lines = notes + [line for line in buffer.getvalue().splitlines() if line.strip()][-12:]
    return StageResult(changed=action in ("started", "created", "replaced"), failed=outcome.exit_code != 0,
                       summary=lines, data=outcome.as_dict())


def node_serve_settings(host: Host, docker_url: str) -> tuple[dict[str, Any], list[str]]:
    """How the server starts on the node's engine: run_serve's keywords (the GPU hand-off the node
    stage set up, and in a lab the memlock limit its machine can give) and notes on them. The serve
    stage and `gpunode bench --ab`'s restarts start it the same way."""
    client = docker_client(docker_url)
    memlock, notes = -1, []
    if host.lab:
        memlock = _engine_memlock_limit(client, plan.server_image(host))
        if memlock != -1:
            notes.append(f"lab: memlock capped at {memlock} bytes, the most this machine gives (no CAP_SYS_RESOURCE); "
                         "a real node gives the server unlimited")
    return {"gpu_handoff": _handoff(host, client), "memlock_bytes": memlock, "engine_is_local": False}, notes


def _engine_memlock_limit(client: Any, image: str) -> int:
    """The hard memlock limit a container gets from this engine (-1: unlimited). A lab whose machine
    is itself a container without CAP_SYS_RESOURCE cannot give the unlimited one sglang asks for."""
    program = "import resource; print(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1])"
    output = client.containers.run(image, ["python3", "-c", program], remove=True, network_mode="none")
    return int(output.decode().strip())


def smoke(host: Host, fw: Forward, check_mode: bool) -> StageResult:

    from gpunode.smoke.bench import DockerBenchRunner
    from gpunode.smoke.command import smoke as run_smoke

    if check_mode:
        return StageResult(summary=["smoke: run only in a real run"])
    local = fw.ports[host.server.port]
    client = docker_client(fw.docker_url)
    from gpunode.serve.command import probe_address

    # The checks go through the SSH forward; the bench runs on the node, where the port is published.
    runner = DockerBenchRunner(client, plan.server_image(host), str(host.model.path),
                               server_url=f"http://{probe_address(host.server.bind)}:{host.server.port}")
    api_key = host.server.api_key.resolve() if host.server.api_key else None
    out = io.StringIO()
    code = run_smoke(f"http://127.0.0.1:{local}", host.served_name, api_key, runner, True, out)
    report = json.loads(out.getvalue())
    checks = sorted(report.get("checks", []), key=lambda c: c["status"] != "fail")  # the failure message: first line
    lines = [f"{c['status'].upper():4} {c['name']}: {c.get('detail', '')}" for c in checks]
    return StageResult(failed=code != 0, summary=lines, data={"exit_code": code, "timings": report.get("timings")})


STAGE_RUNNERS = {"image": image, "p2p": p2p, "serve": serve, "smoke": smoke}


def run(stage: str, host: Host, api_key_file: str | None, check_mode: bool) -> StageResult:
    """Run one GPU-side stage for ``host`` on its node's engine (messages say no stage name: the
    module puts it in front)."""
    if api_key_file and host.server.api_key is not None:
        # The run's secret files stand in for env secrets, which are kept out of Ansible's environment.
        host = host.model_copy(update={"server": host.server.model_copy(update={"api_key": SecretRef(file=Path(api_key_file))})})
    import docker

    missing = (f"the image {plan.server_image(host) if stage != 'p2p' else plan.image_tag(host)} is not on the "
               "node's engine: run the image stage first (`gpunode provision --tags image`)")
    try:
        ports = (host.server.port,) if stage == "smoke" else ()
        with forward(host.container.reach, ports) as fw:
            return STAGE_RUNNERS[stage](host, fw, check_mode)
    except docker.errors.ImageNotFound:
        return StageResult(failed=True, summary=[missing])
    except docker.errors.NotFound as exc:
        if "No such image" in str(exc):
            return StageResult(failed=True, summary=[missing])
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
    except docker.errors.DockerException as exc:
        return StageResult(failed=True, summary=[f"Docker on the node: {exc}"])
