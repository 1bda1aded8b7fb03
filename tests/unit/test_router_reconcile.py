"""The router stage's reconcile against a stand-in of the router's worker API (the real router's
answers are in stages/router/api.py's docstring and tests/lab/test_fleet.py): a worker the router
lists as 'unknown' (registered without the key) is registered again with the key, one at a time;
another model name, an empty one, or no key leaves it alone; the key never reaches an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from gpunode.derive import RouterWorkerSpec
from gpunode.stages.router import stage
from gpunode.stages.router.api import RouterApi, RouterUnavailable, RouterWorker

KEY = "-secret-fleet-key-0123456789abcdef"


@dataclass
class FakeRouterApi:
    """The router's /workers as a dict; a removal is gone at once, an addition reads the model
    only when it comes with the key."""

    workers: dict[str, RouterWorker]
    calls: list[str] = field(default_factory=list)

    def workers_list(self) -> list[RouterWorker]:
        return list(self.workers.values())

    def add_worker(self, url: str, api_key: str | None) -> None:
        self.calls.append(f"add {url} {'with key' if api_key else 'without key'}")
        self.workers[url] = RouterWorker(f"id-{len(self.calls)}", url, True, "glm-5" if api_key else "unknown")

    def remove_worker(self, worker: RouterWorker) -> None:
        self.calls.append(f"remove {worker.url}")
        self.workers.pop(worker.url)


def _api(known: dict[str, str]) -> Any:
    fake = FakeRouterApi({url: RouterWorker(f"id-{url}", url, True, model) for url, model in known.items()})
    api = SimpleNamespace(workers=fake.workers_list, add_worker=fake.add_worker, remove_worker=fake.remove_worker,
                          fake=fake)
    # The router's own polling (RouterApi's), over the stand-in's list.
    api.wait_listed = partial(RouterApi.wait_listed, api)
    api.wait_gone = partial(RouterApi.wait_gone, api)
    return api


def _container() -> Any:
    return SimpleNamespace(exec_run=lambda argv: SimpleNamespace(output=b"200\n", exit_code=0))


WORKERS = tuple(RouterWorkerSpec(host=f"pve{i}", node=f"pve{i}-ct", url=f"http://10.0.3.{i}:30000") for i in (1, 2, 3))


def _reconcile(api: Any, key: str | None = KEY) -> tuple[bool, list[str], dict[str, str]]:
    return stage.reconcile(api, _container(), WORKERS, False, health_wait_s=1, served_name="glm-5", api_key=key)


def test_a_worker_listed_as_unknown_is_registered_again_with_the_key_one_at_a_time() -> None:
    api = _api({"http://10.0.3.1:30000": "glm-5", "http://10.0.3.2:30000": "unknown", "http://10.0.3.3:30000": "unknown"})
    changed, lines, down = _reconcile(api)
    assert changed and down == {}
    assert api.fake.calls == ["remove http://10.0.3.2:30000", "add http://10.0.3.2:30000 with key",
                              "remove http://10.0.3.3:30000", "add http://10.0.3.3:30000 with key"]
    assert "worker pve2 (http://10.0.3.2:30000): registered again (the router listed its model as 'unknown', " \
           "not 'glm-5': it had no key to read it)" in lines
    assert {w.model_id for w in api.workers()} == {"glm-5"}
    assert _reconcile(api) == (False, [f"worker pve{i} (http://10.0.3.{i}:30000): healthy" for i in (1, 2, 3)], {})


@pytest.mark.parametrize("model, key", [("glm-5-fp8", KEY), ("", KEY), ("unknown", None)])
def test_another_model_an_empty_one_or_no_key_is_left_alone(model: str, key: str | None) -> None:
    api = _api({w.url: (model if w.host == "pve2" else "glm-5") for w in WORKERS})
    changed, _lines, down = _reconcile(api, key)
    assert not changed and down == {} and api.fake.calls == []


def test_a_missing_worker_is_registered_with_the_key() -> None:
    api = _api({"http://10.0.3.1:30000": "glm-5", "http://10.0.3.3:30000": "glm-5"})
    changed, lines, _ = _reconcile(api)
    assert changed and api.fake.calls == ["add http://10.0.3.2:30000 with key"]
    assert "worker pve2 (http://10.0.3.2:30000): registered (it answers /health again)" in lines


def test_the_key_never_reaches_a_refusal_even_when_the_router_echoes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    api = RouterApi("http://127.0.0.1:9", KEY)
    echoed = "refused worker " + "x" * 175 + KEY  # the bare key straddles the 200-character cut
    monkeypatch.setattr(api, "_call", lambda *a, **k: SimpleNamespace(status_code=400, text=echoed))
    with pytest.raises(RouterUnavailable) as refused:
        api.add_worker("http://w:30000", KEY)
    assert KEY[:10] not in str(refused.value) and "***" in str(refused.value)
    assert "HTTP 400" in str(refused.value)
