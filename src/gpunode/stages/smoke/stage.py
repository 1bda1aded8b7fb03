"""The smoke stage: prove the node's server answers correctly (gpunode.stages.smoke.command), the checks
through the SSH forward of its port, the short bench on the node where the port is published; the
result goes into the record the node keeps for `gpunode check` (/etc/gpunode/smoke.json), naming
the server container it proved."""

from __future__ import annotations

import io
import json

from typing import Any

from gpunode.stages.engine import Forward, docker_client, served_at
from gpunode.stages.common import Reach, StageResult, Target


def record(container_id: str | None, code: int, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/smoke.json: which server container was proved, and how
    it went (the check asks "did the server that runs now pass", not the timings)."""
    return {"container": container_id, "ok": code == 0, "exit_code": code,
            "failed": [f"{c['name']}: {c.get('detail', '')}" for c in checks if c["status"] == "fail"]}


target_from_data = Target.from_data


def reach(target: Target) -> Reach:
    """The node's engine, with the server's port forwarded from where its bind publishes it; the image
    this stage needs there."""
    server = target.host.server
    return Reach(target.host.container.reach, (served_at(server.bind, server.port),), target.derived.server_image)


def run(target: Target, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.stages.serve.command import probe_address
    from gpunode.stages.smoke.bench import DockerBenchRunner
    from gpunode.stages.smoke.command import smoke as run_smoke

    if check_mode:
        return StageResult(summary=["smoke: run only in a real run"])
    host = target.host
    client = docker_client(fw.docker_url)
    runner = DockerBenchRunner(client, target.derived.server_image, str(host.model.path),
                               server_url=f"http://{probe_address(host.server.bind)}:{host.server.port}")
    api_key = host.server.api_key.resolve() if host.server.api_key else None
    out = io.StringIO()
    code = run_smoke(f"http://{fw.at(host.server.port)}", target.derived.served_name, api_key, runner, True, out)
    report = json.loads(out.getvalue())
    checks = sorted(report.get("checks", []), key=lambda c: c["status"] != "fail")  # the failure message: first line
    lines = [f"{c['status'].upper():4} {c['name']}: {c.get('detail', '')}" for c in checks]
    from gpunode.stages.serve.docker_run import find_container

    server = find_container(client, target.derived.server_container)
    return StageResult(failed=code != 0, summary=lines,
                       data={"exit_code": code, "timings": report.get("timings"),
                             "record": record(server.id if server else None, code, checks)})
