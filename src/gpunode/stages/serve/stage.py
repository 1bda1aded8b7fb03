"""The serve stage: start the server on the node's engine from the derived image and launch, with
the hand-off the node stage set up, and wait until it serves (gpunode.stages.serve.command)."""

from __future__ import annotations

import io
from typing import Any

from gpunode.stages.engine import Forward, docker_client, served_at
from gpunode.stages.common import Reach, StageResult, Target, console, node_handoff


target_from_data = Target.from_data


def reach(target: Target) -> Reach:
    """The node's engine, with the server's port forwarded from where its bind publishes it (readiness
    is probed there); the image this stage needs there."""
    server = target.host.server
    return Reach(target.host.container.reach, (served_at(server.bind, server.port),), target.derived.server_image)


def run(target: Target, fw: Forward, check_mode: bool, timeout_s: float = 3600.0) -> StageResult:
    from gpunode.catalogue.handoff import HandoffError
    from gpunode.stages.serve.command import run_serve

    if check_mode:
        return _foreseen(target, fw)
    from gpunode.stages.engine import link_count, read_file
    from gpunode.stages.model.stage import RECORD, refusal, stale_mount

    # Never a server on weights the model stage did not prove whole: it would die loading them, minutes in.
    plan, node = target.derived.model, target.host.container.reach
    refused = refusal(plan, read_file(node, RECORD)) or stale_mount(
        plan, target.host.container.vmid, link_count(node, plan.mount_target))
    if refused is not None:
        return StageResult(failed=True, summary=[f"serve: refused: {refused}"])
    buffer = io.StringIO()
    try:
        settings, notes = node_settings(target, fw.docker_url)
    except HandoffError as exc:
        return StageResult(failed=True, summary=[f"serve: {exc}"])
    outcome = run_serve(target.host, target.derived.server_image, fw.docker_url, console(buffer), timeout_s,
                        launch=target.derived.launch, probe_url=f"http://{fw.at(target.host.server.port)}", **settings)
    action = outcome.start.action if outcome.start else "none"
    lines = notes + [line for line in buffer.getvalue().splitlines() if line.strip()][-12:]
    failed = outcome.exit_code != 0
    return StageResult(changed=action in ("started", "created", "replaced"), failed=failed,
                       summary=lines, data=outcome.as_dict(), cause=outcome.cause() if failed else None)


VERB = {"kept": "keep", "started": "start", "created": "create", "replaced": "replace"}


def foresee(target: Target, fw: Forward) -> Any:
    """What the serve stage would do to the node's server now (a docker_run.Decision), decided by the
    code that acts on it, from the same spec; nothing is changed. A server image that is not on the
    node's engine yet (the image stage builds it) is a new image: the server is replaced."""
    import docker

    from gpunode.stages.serve import command, docker_run
    from gpunode.derive.serverspec import CONTAINER_NAME

    client = docker_client(fw.docker_url)
    try:
        client.images.get(target.derived.server_image)
    except docker.errors.ImageNotFound:
        current = docker_run.find_container(client, CONTAINER_NAME)
        why = f"the image {target.derived.server_image} is not on the node's engine yet"
        return (docker_run.Decision("replaced", f"changed: image ({why})", current) if current is not None
                else docker_run.Decision("created", f"no {CONTAINER_NAME} container yet"))
    settings, _notes = node_settings(target, fw.docker_url)
    return command.foresee(target.host, target.derived.server_image, fw.docker_url, launch=target.derived.launch,
                           **settings)


def _foreseen(target: Target, fw: Forward) -> StageResult:
    """Check mode: what a real run would do to the server, said, and changed when it would restart it."""
    from gpunode.catalogue.handoff import HandoffError
    from gpunode.stages.serve.command import NotPrepared
    from gpunode.stages.serve.docker_run import ServeError

    try:
        decision = foresee(target, fw)
    except (NotPrepared, ServeError, HandoffError) as exc:
        return StageResult(failed=True, summary=[f"serve: {exc}"])
    return StageResult(changed=decision.restarts, summary=[f"serve: would {VERB[decision.action]} the server "
                                                            f"({decision.reason})"],
                       data={"foreseen": {"action": decision.action, "reason": decision.reason}})


def node_settings(target: Target, docker_url: str) -> tuple[dict[str, Any], list[str]]:
    """How the server starts on the node's engine: run_serve's keywords (the GPU hand-off the node
    stage set up, and in a lab the memlock limit its machine can give) and notes on them. The serve
    stage and `gpunode bench --ab`'s restarts start it the same way."""
    client = docker_client(docker_url)
    memlock, notes = -1, []
    if target.host.lab:
        memlock = _engine_memlock_limit(client, target.derived.server_image)
        if memlock != -1:
            notes.append(f"lab: memlock capped at {memlock} bytes, the most this machine gives (no CAP_SYS_RESOURCE); "
                         "a real node gives the server unlimited")
    return {"gpu_handoff": node_handoff(target.host, client), "memlock_bytes": memlock, "engine_is_local": False}, notes


def _engine_memlock_limit(client: Any, image: str) -> int:
    """The hard memlock limit a container gets from this engine (-1: unlimited). A lab whose machine
    is itself a container without CAP_SYS_RESOURCE cannot give the unlimited one sglang asks for."""
    program = "import resource; print(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1])"
    output = client.containers.run(image, ["python3", "-c", program], remove=True, network_mode="none")
    return int(output.decode().strip())
