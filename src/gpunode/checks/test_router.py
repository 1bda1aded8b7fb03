"""Layer router: SGLang's router on the router machine: running the configured image and flags,
answering /v1/models with the served model, every host's server registered and healthy in its
view (one check per worker, named after its host), and the smoke checks passed through it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpunode.checks.conftest import assert_container_runs, container_get, docker_inspect, node_record, quote
from gpunode.stages.router.api import PROBE, probe_answer
from gpunode.derive.routerspec import CONTAINER_NAME, KEY_FILE

FIX = "run `gpunode provision <host file> --tags router`"


@pytest.fixture
def router(host: Any) -> Any:
    """The host, when it is the router machine (group routers); other hosts skip this check."""
    if "routers" not in host.backend.get_variables().get("group_names", []):
        pytest.skip("not-in-layer: not the router")
    return host


def _running(router: Any) -> dict[str, Any]:
    found = docker_inspect(router, "container", CONTAINER_NAME)
    if found is None or not found["State"]["Running"]:
        pytest.fail(f"the router container is not running (see test_router_container_running) -> {FIX}")
    return found


def _get(router: Any, gpunode_router: dict[str, Any], path: str) -> tuple[int, str]:
    """GET on the router from inside its container, with the key file it holds."""
    return container_get(router, CONTAINER_NAME, int(gpunode_router["port"]), KEY_FILE,
                         f"open({KEY_FILE!r}).read().strip()", path)


def test_router_container_running(router: Any, gpunode_derived: dict[str, Any]) -> None:
    assert_container_runs(router, CONTAINER_NAME, "router", "the router machine", gpunode_derived["image_tag"],
                          list(gpunode_derived["argv"]), FIX)


def test_router_answers_models(router: Any, gpunode_router: dict[str, Any], gpunode_derived: dict[str, Any]) -> None:
    _running(router)
    status, body = _get(router, gpunode_router, "/v1/models")
    assert status == 200, f"the router answers /v1/models with {status}: {body[:200]} -> {FIX}"
    names = [m.get("id") for m in json.loads(body).get("data", [])]
    assert gpunode_derived["served_name"] in names, (
        f"the router lists {names}, not {gpunode_derived['served_name']!r}: no worker serving it is registered -> {FIX}")


def test_worker_healthy(worker: str, router: Any, gpunode_router: dict[str, Any],
                        gpunode_derived: dict[str, Any]) -> None:
    """One check per worker (its host's name): registered in the router and healthy there."""
    wanted = next((w for w in gpunode_derived["workers"] if w["host"] == worker), None)
    if wanted is None:
        pytest.skip(f"not-in-layer: {worker} is not a worker of this router")
    _running(router)
    status, body = _get(router, gpunode_router, "/workers")
    assert status == 200, f"the router answers /workers with {status}: {body[:200]} -> {FIX}"
    found = next((w for w in json.loads(body).get("workers", []) if w.get("url") == wanted["url"]), None)
    if found is not None and found.get("is_healthy"):
        return
    said = router.run(f"docker exec {quote(CONTAINER_NAME)} python3 -c {quote(PROBE)} {quote(wanted['url'])}")
    _ok, answer = probe_answer(said.stdout)
    where = "not registered in the router" if found is None else "registered but unhealthy in the router"
    pytest.fail(f"worker {worker} ({wanted['url']}) is {where}; the worker itself {answer} -> "
                f"run `gpunode provision <host file> --limit {worker}`")


def test_smoke_passed_through_the_router(router: Any) -> None:
    record = node_record(router, "router")
    assert record is not None, f"the router stage never ran to its end here -> {FIX}"
    found = docker_inspect(router, "container", CONTAINER_NAME)
    assert found is not None and record.get("container") == found["Id"], (
        f"the smoke record is for another router container than the one that runs -> {FIX}")
    smoke = record.get("smoke") or {}
    assert smoke.get("ok"), f"the smoke checks failed through the router: {'; '.join(smoke.get('failed') or [])} -> {FIX}"
