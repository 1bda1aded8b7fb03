"""The image stage: build the server image where the host file says (the node's engine, or this
machine's and then ship it), verify it, and return the record the node keeps for `gpunode check`
(/etc/gpunode/image.json). A lab host with a stand-in ships the stand-in's image instead."""

from __future__ import annotations

import io
from typing import Any

from gpunode.stages.engine import Forward, docker_client
from gpunode.stages.common import Reach, StageResult, Target, console


def record(tag: str, image_id: str | None, verified: bool | None, failed: list[str], note: str = "") -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/image.json for `gpunode check` (stable across runs)."""
    return {"tag": tag, "id": image_id, "verified": verified, "failed": failed, "note": note}


def _stand_in(target: Target, fw: Forward, check_mode: bool) -> StageResult:
    """Lab: put the fake server's image (built here by `gpunode lab up`) on the node's engine."""
    from gpunode.stages.image.ship import image_id, ship

    tag = target.derived.server_image
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
                       data={"tag": tag, "record": record(tag, local, None, [], note)})


target_from_data = Target.from_data


def reach(target: Target) -> Reach:
    """The node's engine; the image this stage needs there."""
    return Reach(target.host.container.reach, (), target.derived.server_image)


def run(target: Target, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.stages.image import BuildError, VerifyError, build, verify
    from gpunode.stages.image.ship import image_id, ship

    host, derived = target.host, target.derived
    if host.image.lab_stand_in:
        return _stand_in(target, fw, check_mode)
    tag = derived.image_tag
    local = host.image.build_on == "local"
    node = docker_client(fw.docker_url)
    buffer = io.StringIO()
    if check_mode:
        present = image_id(node, tag) is not None
        return StageResult(changed=not present, summary=[f"image {tag}: {'present' if present else 'would be built'}"])
    try:
        built = build(host.image, None if local else fw.docker_url, console(buffer), aot=derived.aot)
        report = verify(built.tag, list(derived.launch.argv), None if local else fw.docker_url, aot=derived.aot)
    except (BuildError, VerifyError) as exc:
        return StageResult(failed=True, summary=[str(exc)], data={"log": buffer.getvalue()[-4000:]})
    lines = [f"image {built.tag}: {'built in %.0f s' % built.seconds if built.built else 'present, not rebuilt'}"]
    lines += [f.line(severity=True) for f in report.findings]
    shipped = False
    if local and report.ok:
        # Built here: the node's engine is where the server runs it.
        shipped = ship(docker_client(None), node, built.tag)
        lines.append(f"image {built.tag}: {'shipped to the node' if shipped else 'already on the node'}")
    kept = record(built.tag, image_id(node, built.tag), report.ok, [f.code for f in report.failed()])
    failing = [f.line() for f in report.failed()]
    return StageResult(changed=built.built or shipped, failed=not report.ok, summary=lines,
                       data={"tag": built.tag, "built": built.built, "verify_ok": report.ok, "record": kept},
                       cause=f"image {built.tag} failed verify: " + "; ".join(failing) if failing else None)
