"""The router stage: SGLang's router on the router machine, with every host's server as a worker.

1. The router image (gpunode.derive.routerimage), built where ``router.image.build_on`` says and, when
   built here, shipped to the router machine's engine.
2. The router container (gpunode.derive.routerspec), kept when its settings are unchanged.
3. The workers, reconciled through the router's own API: a worker the router does not know yet
   (it was down when the router started, and the router gave up on it) is registered once it
   answers its /health from the router's network; a worker that is no longer in the host file is
   removed; then the stage waits, bounded, until the router reports every live worker healthy. A
   worker that is down is named and left out: the router serves with the others.
4. The smoke checks once more, through the router (and the short bench, from the router machine,
   when it is a node that holds the server image).

The record (/etc/gpunode/router.json on the router machine) says which workers were healthy and
whether the checks passed through the router.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.derive import RouterDerived, RouterWorkerSpec
from gpunode.stages.engine import Forward, docker_client, served_at
from gpunode.hostfile import Router
from gpunode.derive import routerimage as router_image
from gpunode.stages.router.build import build as build_router_image
from gpunode.derive import routerspec as specs
from gpunode.stages.router.api import PROBE, RouterApi, RouterUnavailable, probe_answer
from gpunode.stages.common import Reach, StageResult, console

READY_TIMEOUT_S = 60.0
UNREAD_MODEL = "unknown"  # the model_id the router gives a worker whose /model_info it could not read
REGISTER_WAIT_S = 20.0  # a new router registers the live workers itself, in the background


@dataclass(frozen=True)
class RouterTarget:
    """The router's settings and the values derived for it (gpunode.derive.derive_router)."""

    router: Router
    derived: RouterDerived
    api_key_file: str | None = None

    @classmethod
    def from_data(cls, router: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None,
                  fabric: dict[str, Any] | None = None) -> RouterTarget:
        if fabric:
            raise ValueError("the router stage reads no PCIe fabric (it has no GPUs)")
        return cls(Router.model_validate(router), RouterDerived.model_validate(derived), api_key_file or None)

    def api_key(self) -> str | None:
        if self.api_key_file:
            return Path(self.api_key_file).read_text(encoding="utf-8").strip()
        return self.router.api_key.resolve() if self.router.api_key is not None else None


target_from_data = RouterTarget.from_data


def reach(target: RouterTarget) -> Reach:
    """The router machine's engine, with the router's and its metrics' ports forwarded (the router's where
    its bind publishes it)."""
    router = target.router
    return Reach(target.derived.reach, (served_at(router.bind, router.port), router.metrics_port),
                 target.derived.image_tag)


def probe_worker(container: Any, url: str) -> tuple[bool, str]:
    """(answers 200, what it answered) for a worker's /health, asked from inside the router container."""
    result = container.exec_run(["python3", "-c", PROBE, url])
    return probe_answer(result.output.decode(errors="replace") or f"0 no output (exit {result.exit_code})")


def reconcile(api: RouterApi, container: Any, workers: tuple[RouterWorkerSpec, ...], fresh: bool,
              health_wait_s: float, served_name: str, api_key: str | None) -> tuple[bool, list[str], dict[str, str]]:
    """Bring the router's workers to the host file's: (changed, lines, down: url -> why).

    A live worker the router lists under the model ``unknown`` (it was registered without the
    fleet's key, so the router could not read its /model_info) is removed and registered again with
    the key, one worker at a time: otherwise /v1/models through the router lists ``unknown``."""
    wanted = {w.url: w for w in workers}
    live, down = set(), {}
    for url in wanted:
        ok, said = probe_worker(container, url)
        if ok:
            live.add(url)
        else:
            down[url] = said
    if fresh:
        api.wait_listed(live, healthy=False, timeout_s=REGISTER_WAIT_S)
    changed, lines = False, []
    known = {w.url: w for w in api.workers()}
    # Only the router's own word for "could not read it", and only when a key would let it: another
    # model name is the operator's, an empty one an older router's.
    unread = sorted(url for url, w in known.items() if url in live and w.model_id == UNREAD_MODEL and api_key)
    for url in unread:  # one at a time: the others keep serving meanwhile
        api.remove_worker(known[url])
        if api.wait_gone({url}, REGISTER_WAIT_S):
            down[url] = f"is listed by the router under model {UNREAD_MODEL!r}, and the router did not remove it"
            live.discard(url)
            continue
        api.add_worker(url, api_key)
        changed = True
        lines.append(f"worker {wanted[url].host} ({url}): registered again (the router listed its model as "
                     f"{UNREAD_MODEL!r}, not {served_name!r}: it had no key to read it)")
    for url in sorted(live - set(known)):
        api.add_worker(url, api_key)
        changed = True
        lines.append(f"worker {wanted[url].host} ({url}): registered (it answers /health again)")
    for url, worker in sorted(known.items()):
        if url not in wanted:
            api.remove_worker(worker)
            changed = True
            lines.append(f"worker {url}: removed (no longer in the host file)")
    healthy = api.wait_listed(live, healthy=True, timeout_s=health_wait_s)
    for url in sorted(live - healthy):
        down[url] = f"answers /health, but the router has not marked it healthy within {health_wait_s:.0f} s"
    for url in sorted(healthy):
        lines.append(f"worker {wanted[url].host} ({url}): healthy")
    for url, why in sorted(down.items()):
        lines.append(f"worker {wanted[url].host} ({url}): DOWN, left out: it {why}")
    return changed, lines, down


def _smoke(target: RouterTarget, fw: Forward, client: Any, api_key: str | None) -> tuple[int, list[dict[str, Any]]]:
    """The smoke checks through the router; the bench too, where the router machine holds the server image."""
    from gpunode.stages.serve.command import probe_address
    from gpunode.stages.smoke.bench import DockerBenchRunner
    from gpunode.stages.smoke.command import run_checks

    router, derived = target.router, target.derived
    runner = None
    if derived.bench_image and derived.model_dir:
        runner = DockerBenchRunner(client, derived.bench_image, derived.model_dir,
                                   server_url=f"http://{probe_address(router.bind)}:{router.port}")
    report = run_checks(f"http://{fw.at(router.port)}", derived.served_name, api_key, runner)
    return report.exit_code, report.as_dict()["checks"]


def run(target: RouterTarget, fw: Forward, check_mode: bool) -> StageResult:
    from gpunode.stages.image.ship import image_id, ship
    from gpunode.stages.serve.docker_run import KeyFile, ServeError, ensure_container, find_container

    router, derived = target.router, target.derived
    inputs = router_image.collect(router.image.base, router.image.ca_bundle)
    if inputs.tag != derived.image_tag:
        return StageResult(failed=True, summary=[f"the router image's inputs give {inputs.tag}, the inventory says "
                                                 f"{derived.image_tag}: this gpunode did not write that inventory"])
    node = docker_client(fw.docker_url)
    here = docker_client(None) if router.image.build_on == "local" else node
    buffer = io.StringIO()
    if check_mode:
        present = image_id(node, inputs.tag) is not None
        current = find_container(node, specs.CONTAINER_NAME)
        return StageResult(changed=not present or current is None,
                           summary=[f"router image {inputs.tag}: {'present' if present else 'would be built'}",
                                    f"router container: {'present' if current else 'would be created'}"])
    built = build_router_image(here, inputs, console(buffer))
    shipped = ship(here, node, inputs.tag) if here is not node else False
    spec = specs.container_spec(image=inputs.tag, argv=derived.argv, bind=router.bind, port=router.port,
                                metrics_port=router.metrics_port)
    api_key = target.api_key()
    try:
        started = ensure_container(node, spec, KeyFile(specs.KEY_FILE, specs.key_file_content(api_key))
                                   if api_key else None)
    except ServeError as exc:
        return StageResult(failed=True, summary=[f"router container: {exc}"])
    lines = [f"router image {inputs.tag}: " + ("built" if built else "present") + (", shipped" if shipped else ""),
             f"router container {specs.CONTAINER_NAME}: {started.action} ({started.reason})"]
    api = RouterApi(f"http://{fw.at(router.port)}", api_key)
    container = node.containers.get(specs.CONTAINER_NAME)
    if not api.wait_healthy(READY_TIMEOUT_S):
        tail = container.logs(tail=8).decode(errors="replace").strip().replace("\n", " | ")
        return StageResult(failed=True, summary=[f"the router does not answer /health after {READY_TIMEOUT_S:.0f} s: "
                                                 f"{tail[-600:]}"] + lines)
    try:
        changed, worker_lines, down = reconcile(api, container, derived.workers, started.action != "kept",
                                                health_wait_s=router.health_check_interval_s * 3 + 10,
                                                served_name=derived.served_name, api_key=api_key)
    except RouterUnavailable as exc:
        return StageResult(failed=True, summary=[f"the router's API: {exc}"] + lines)
    healthy = [w for w in derived.workers if w.url not in down]
    code, checks = _smoke(target, fw, node, api_key)
    failed_checks = [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "fail"]
    lines += worker_lines
    lines += [f"{c['status'].upper():4} through the router: {c['name']}: {c['detail']}" for c in checks]
    record = {"container": container.id, "image": inputs.tag, "workers": {w.host: w.url not in down for w in derived.workers},
              "down": {wanted.host: down[wanted.url] for wanted in derived.workers if wanted.url in down},
              "smoke": {"ok": code == 0, "exit_code": code, "failed": failed_checks}}
    failed = not healthy or code != 0
    if failed:
        first = ("no worker is healthy: " + "; ".join(f"{w.host}: {down[w.url]}" for w in derived.workers)
                 if not healthy else f"the smoke checks failed through the router: {'; '.join(failed_checks)}")
        lines.insert(0, first)
    return StageResult(changed=built or shipped or started.action != "kept" or changed, failed=failed,
                       summary=lines, data={"record": record})


__all__ = ["RouterTarget", "reconcile", "run"]
