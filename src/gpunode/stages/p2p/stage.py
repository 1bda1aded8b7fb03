"""The p2p stage: gpunode.stages.p2p inside the server image on the node, with the server's GPU hand-off,
for the GPUs and expectations of the host file; the verdict goes into the record the node keeps for
`gpunode check` (/etc/gpunode/p2p.json)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from gpunode.ground import exitcodes
from gpunode.stages.engine import Forward, docker_client
from gpunode.stages.common import Reach, StageResult, Target, node_handoff
from gpunode.stages.p2p.fabric import CAUSES as FABRIC_CAUSES

PASSED = (exitcodes.OK, exitcodes.NOT_APPLICABLE)  # pass; pass with one GPU (pairs not applicable)
IN_CONTAINER = "/opt/gpunode-src"


PCI_FABRIC = "ansible_collections/gpunode/core/plugins/module_utils/pci_fabric.py"  # stdlib only; namespace packages
FABRIC_FILE = "fabric.json"


def archive(fabric: dict[str, Any] | None = None) -> bytes:
    """The gpunode.stages.p2p package (stdlib + torch + nvidia-ml-py), the exit codes it returns, the
    way it shows a value in a message, the one Finding type its verdict is made of and the fabric
    reader it judges with, as a tar for the server image; with the host's fabric facts as
    fabric.json beside them, when the play read them."""
    package = Path(__file__).resolve().parents[2]
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name in ("__init__.py", "ground/__init__.py", "ground/exitcodes.py", "ground/finding.py", "ground/text.py",
                     "stages/__init__.py", PCI_FABRIC):
            tar.add(package / name, arcname=f"gpunode/{name}")
        for path in sorted((package / "stages" / "p2p").glob("*.py")):
            if path.name != "stage.py":  # this file: the controller's side
                tar.add(path, arcname=f"gpunode/stages/p2p/{path.name}")
        if fabric is not None:
            text = json.dumps(fabric).encode()
            info = tarfile.TarInfo(FABRIC_FILE)
            info.size, info.mode = len(text), 0o644
            tar.addfile(info, io.BytesIO(text))
    return data.getvalue()


target_from_data = Target.from_data


def reach(target: Target) -> Reach:
    """The node's engine; the image this stage needs there."""
    return Reach(target.host.container.reach, (), target.derived.image_tag)


def run(target: Target, fw: Forward, check_mode: bool) -> StageResult:
    """Run `gpunode.stages.p2p` inside the server image with the server's GPU hand-off."""
    if check_mode:
        return StageResult(summary=["p2p: measured only in a real run"])
    host = target.host
    expect = host.p2p
    command = ["python3", "-m", "gpunode.stages.p2p", "--json", "--min-gpus", str(target.derived.tp_size),
               "--same-numa-gbps", str(expect.same_numa_gbps), "--cross-numa-gbps", str(expect.cross_numa_gbps),
               "--nvlink-gbps", str(expect.nvlink_gbps)] + ([] if expect.required else ["--not-required"])
    if target.fabric is not None:
        command += ["--fabric-file", f"{IN_CONTAINER}/{FABRIC_FILE}"]
    client = docker_client(fw.docker_url)
    # NVLink multicast off in any child environment (a shared host's GPUs can be put out of service).
    env = {"PYTHONPATH": IN_CONTAINER, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    container = client.containers.create(target.derived.image_tag, command=command, environment=env,
                                         ipc_mode="host", labels={"io.gpunode.role": "p2p-check"},
                                         **node_handoff(host, client).run_kwargs())
    try:
        _mkdir(container)
        container.put_archive(IN_CONTAINER, archive(target.fabric))
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
    return StageResult(failed=code not in PASSED, summary=lines,
                       data={"exit_code": code, "verdict": verdict, "record": record(host.container.gpus, code, verdict)})


def _finding_line(finding: dict[str, Any]) -> str:
    return f"{finding['severity'].upper():4} {finding['subject']} {finding['code']}: {finding['message']}"


def record(gpus: str | list[int], code: int, verdict: dict[str, Any]) -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/p2p.json for `gpunode check`: the verdict, no timings
    (the check asks "did it pass, for these GPUs", not the numbers, which `gpunode p2p` reports)."""
    return {"gpus": gpus, "ok": code in PASSED, "exit_code": code, "status": verdict.get("status"),
            "summary": verdict.get("summary", ""),
            "failed": [_finding_line(f) for f in verdict.get("findings", []) if f["severity"] == "fail"],
            "causes": [_finding_line(f) + (f" -> {f['fix']}" if f.get("fix") else "")
                       for f in verdict.get("findings", []) if f["code"] in FABRIC_CAUSES]}


def _mkdir(container: Any) -> bool:
    # put_archive needs the target folder; an empty tar with it is the cheapest way to make it.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo(IN_CONTAINER.lstrip("/"))
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
    return bool(container.put_archive("/", data.getvalue()))
