"""The lab fleet (inventory/lab/fleet.yml): two Proxmox hosts, each with its own fakepve, host
container and GPU node, provisioned in one run, and SGLang's real router (sglang-router, in its
own image) in front of both stand-in servers.

Idempotence is read from ansible-runner's stats; the router's view of its workers from its own
API and metrics; the faults are made for real (a fakepve stopped, a server container stopped, a
worker deleted from the router) and repaired by gpunode.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

import gpunode_lab as lab
from gpunode import derive, hostfile
from gpunode.stages.engine import forward
from gpunode.stages.router.api import RouterApi, read_metrics, worker_requests
from gpunode.derive.routerspec import CONTAINER_NAME as ROUTER_CONTAINER
from gpunode.derive.serverspec import CONTAINER_NAME as SERVER_CONTAINER

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
HOSTS = ("pve-lab1", "pve-lab2")
NODES = ("pve-lab1-ct202", "pve-lab2-ct201")
ALL = (*HOSTS, *NODES, "router")
WORKER2 = "http://10.0.3.12:30000"


@pytest.fixture(scope="module")
def fleet() -> hostfile.HostFile:
    return hostfile.load(FLEET)


@pytest.fixture(scope="module")
def router_api(fleet: hostfile.HostFile) -> RouterApi:
    routed = derive.derive_router(fleet)
    assert routed is not None
    key = lab.FLEET_API_KEY.read_text().strip()
    # The lab's key begins with "-": the servers and the router that serve these tests prove it works.
    assert key.startswith("-"), "the lab's fleet key should begin with '-' (gpunode lab up writes it so)"
    return RouterApi(routed.url, key)


def _summary(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout.strip(), result.stderr[-3000:]
    return json.loads(result.stdout)


def _changed(summary: dict[str, Any]) -> dict[str, int]:
    return {host: n for host, n in summary["stats"].get("changed", {}).items() if n}


def _on_node2(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(command, host=lab.SITE2.gpu.ip), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _chat(router_api: RouterApi, count: int, padding: int = 0) -> list[int]:
    """``count`` chat requests through the router, one after another (bounded: a few seconds).

    Each prompt begins with a fresh random word, so no prefix a request (or an earlier test) left in
    the router's tree matches it: the cache-aware policy (sglang-router 0.3.2,
    src/policies/cache_aware.rs, select_worker) sends a request whose match rate is at most its
    cache_threshold to the worker with the smallest tree, instead of to the one that holds the prompt.
    ``padding`` words more make each request weigh that much more in the tree it joins."""
    def body() -> dict[str, Any]:
        text = " ".join([secrets.token_hex(8), "What is 6 times 7?", *["Please."] * padding])
        return {"model": "glm-5", "messages": [{"role": "user", "content": text}], "max_tokens": 8,
                "chat_template_kwargs": {"enable_thinking": False}}
    return [router_api.session.post(f"{router_api.base_url}/v1/chat/completions", json=body(), timeout=60).status_code
            for _ in range(count)]


def _per_worker(fleet: hostfile.HostFile) -> dict[str, int]:
    """The router's own count of requests sent to each worker (its metrics, on the router node's loopback)."""
    assert fleet.router is not None and fleet.router_host is not None
    with forward(fleet.router_host.container.reach, (fleet.router.metrics_port,)) as fw:
        return worker_requests(read_metrics(f"http://127.0.0.1:{fw.ports[fleet.router.metrics_port]}/metrics"))


def _models(router_api: RouterApi) -> list[str]:
    """The model ids /v1/models lists through the router."""
    reply = router_api.session.get(f"{router_api.base_url}/v1/models", timeout=30)
    assert reply.status_code == 200, reply.text[:300]
    return [m["id"] for m in reply.json()["data"]]


def _model_of(router_api: RouterApi, url: str) -> str:
    return next(w.model_id for w in router_api.workers() if w.url == url)


def _wait_router_sees(router_api: RouterApi, url: str, healthy: bool | None, timeout_s: float = 60) -> None:
    """Until the router lists ``url`` with that health (None: not at all)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {w.url: w.healthy for w in router_api.workers()}
        if (url not in seen) if healthy is None else seen.get(url) is healthy:
            return
        assert time.monotonic() < deadline, f"the router still lists {seen} after {timeout_s:.0f} s"
        time.sleep(1)


@pytest.fixture(scope="module")
def converged(gpunode_module, router_api: RouterApi) -> dict[str, Any]:
    """The fleet provisioned twice: the first run converges both hosts and the router, the second
    changes nothing."""
    first = gpunode_module("provision", str(FLEET), "--json", timeout=1800)
    assert first.returncode == 0, first.stderr[-4000:]
    second = gpunode_module("provision", str(FLEET), "--json", timeout=900)
    assert second.returncode == 0, second.stderr[-4000:]
    return {"first": _summary(first), "second": _summary(second), "log": second.stderr}


def test_both_hosts_and_the_router_converge_and_a_second_run_changes_nothing(converged: dict[str, Any]) -> None:
    first, second = converged["first"], converged["second"]
    for summary in (first, second):
        assert summary["status"] == "successful" and summary["failed_hosts"] == []
        assert set(summary["stats"]["ok"]) >= set(ALL), summary["stats"]["ok"]
        assert not summary["stats"].get("failures") and not summary["stats"].get("dark")
    assert _changed(second) == {}, second["stats"]["changed"]
    # Each host's stages ran on its own node, and the router took both as workers.
    assert "worker pve-lab1 (http://10.0.3.14:30000): healthy" in converged["log"]
    assert f"worker pve-lab2 ({WORKER2}): healthy" in converged["log"]
    assert "PASS through the router: tool_call:" in converged["log"]


def test_the_router_reads_every_workers_model(converged: dict[str, Any], router_api: RouterApi) -> None:
    # Each worker registered with the fleet's key: the router read its model, and lists that one only.
    assert {w.url: w.model_id for w in router_api.workers()} == {"http://10.0.3.14:30000": "glm-5", WORKER2: "glm-5"}
    assert _models(router_api) == ["glm-5"]


def test_check_reports_every_host_and_the_router(gpunode, converged: dict[str, Any]) -> None:
    result = gpunode("check", str(FLEET), "--json", timeout=600)
    report = json.loads(result.stdout)
    assert result.returncode == 0, [r for r in report["results"] if r["status"] == "fail"]
    hosts = {r["host"] for r in report["results"] if r["status"] == "pass"}
    assert hosts == set(ALL)
    passed = {(r["host"], r["check"]) for r in report["results"] if r["status"] == "pass"}
    assert {("router", "test_worker_healthy[pve-lab1]"), ("router", "test_worker_healthy[pve-lab2]"),
            ("router", "test_smoke_passed_through_the_router"), ("pve-lab2-ct201", "test_server_healthy"),
            ("pve-lab2", "test_container_exists")} <= passed


def test_the_bench_through_the_router_counts_each_workers_requests(gpunode, converged: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = gpunode("bench", str(FLEET), "--router", "--levels", "2,8", "--input-len", "32", "--output-len", "16",
                     "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for line in lines:
        workers = line["gpunode"]["workers"]
        assert set(workers) == {"pve-lab1 (http://10.0.3.14:30000)", f"pve-lab2 ({WORKER2})"}
        # round_robin: every completed request (and the bench's warm-up one) went to one of the two, evenly.
        assert sum(workers.values()) == line["completed"] + 1 and min(workers.values()) >= line["completed"] // 2 - 1
    report = (out / "report.md").read_text()
    assert "## Requests per worker (the router's metrics)" in report and f"pve-lab2 ({WORKER2})" in report


def test_one_hosts_api_down_the_other_host_and_the_router_still_converge(
        gpunode, converged: dict[str, Any], fleet: hostfile.HostFile, router_api: RouterApi,
        fleet_sites_whole: Any) -> None:
    # A second host whose API is down and whose server never came up (a host joining the fleet);
    # no reading of the whole lab meanwhile (tests/lab/conftest.py).
    with fleet_sites_whole():
        _second_hosts_api_down(gpunode, router_api)
    again = gpunode("provision", str(FLEET), "--limit", "pve-lab2", "--json", timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _summary(again)["failed_hosts"] == []
    assert f"worker pve-lab2 ({WORKER2}): healthy" in again.stderr


def _second_hosts_api_down(gpunode: Any, router_api: RouterApi) -> None:
    assert lab.stop_pve(lab.SITE2)
    try:
        assert _on_node2(f"docker rm -f {SERVER_CONTAINER}").returncode == 0
        result = gpunode("provision", str(FLEET), "--json", timeout=900)
        assert result.returncode == 1, result.stderr[-3000:]
        summary = _summary(result)
        assert summary["failed_hosts"] == ["pve-lab2"]
        failures = {(f["host"], f["task"]): f["message"] for f in summary["failures"]}
        assert set(h for h, _ in failures) == {"pve-lab2", "pve-lab2-ct201"}, failures
        assert failures[("pve-lab2", "Converge the GPU container through the Proxmox API")].startswith(
            "unreachable: Proxmox API https://127.0.0.3:8006 unreachable")
        assert failures[("pve-lab2-ct201", "Stop this node when its Proxmox host did not finish a stage of this run")] \
            .startswith("not run: its Proxmox host pve-lab2 did not finish the container stage")
        for host in ("pve-lab1", "pve-lab1-ct202", "router"):  # the rest went on, and converged
            assert summary["stats"]["ok"].get(host, 0) > 0 and host not in summary["stats"].get("failures", {})
        assert f"worker pve-lab2 ({WORKER2}): DOWN, left out: it does not answer" in result.stderr
        # The router serves with the one worker left.
        assert _chat(router_api, 6) == [200] * 6
    finally:
        lab.fakepve.ensure_pve(lambda _line: None, lab.SITE2)


def test_a_dead_worker_is_left_out_named_by_check_and_brought_back(
        gpunode, converged: dict[str, Any], fleet: hostfile.HostFile, router_api: RouterApi) -> None:
    assert _on_node2(f"docker stop {SERVER_CONTAINER}").returncode == 0
    # Requests through the router still succeed: it retries on the live worker, then stops sending
    # to the dead one once its health checks fail.
    assert _chat(router_api, 10) == [200] * 10
    _wait_router_sees(router_api, WORKER2, healthy=False)
    check = gpunode("check", str(FLEET), "--layer", "router", "--json", timeout=300)
    assert check.returncode == 1
    failed = [r for r in json.loads(check.stdout)["results"] if r["status"] == "fail"]
    assert [(r["host"], r["check"]) for r in failed] == [("router", "test_worker_healthy[pve-lab2]")]
    assert failed[0]["message"].startswith(f"worker pve-lab2 ({WORKER2}) is registered but unhealthy in the router; "
                                           "the worker itself does not answer:")
    assert failed[0]["message"].endswith("--limit pve-lab2`")
    before = _per_worker(fleet)
    # The fix the check names, as it names it.
    repaired = gpunode("provision", str(FLEET), "--limit", "pve-lab2", "--json", timeout=900)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert _changed(_summary(repaired)).get("pve-lab2-ct201", 0) >= 1  # the server started again
    _wait_router_sees(router_api, WORKER2, healthy=True)
    # The router uses it again. Fresh prompts go to the worker whose tree is smallest; the one that
    # served alone may hold less than the one that came back, so send (heavy prompts, a bounded
    # number of rounds) until that gap is closed and the returned worker gets its share.
    for _ in range(5):
        assert _chat(router_api, 6, padding=2000) == [200] * 6
        after = _per_worker(fleet)
        if after[WORKER2] > before[WORKER2]:
            break
    assert after[WORKER2] > before[WORKER2], (before, after)
    assert gpunode("check", str(FLEET), "--layer", "router", timeout=300).returncode == 0


def test_a_worker_the_router_dropped_is_registered_again(gpunode, converged: dict[str, Any],
                                                         router_api: RouterApi) -> None:
    # As when the router gave up on a worker that was down when it started: it no longer knows it.
    dropped = next(w for w in router_api.workers() if w.url == WORKER2)
    router_api.remove_worker(dropped)
    _wait_router_sees(router_api, WORKER2, healthy=None)
    result = gpunode("router", str(FLEET), "--json", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _changed(_summary(result)) == {"router": 1}
    assert f"worker pve-lab2 ({WORKER2}): registered (it answers /health again)" in result.stderr
    _wait_router_sees(router_api, WORKER2, healthy=True)
    # Registered with the fleet's key, so the router could read the worker's model.
    assert _models(router_api) == ["glm-5"] and _model_of(router_api, WORKER2) == "glm-5"
    again = gpunode("router", str(FLEET), "--json", timeout=600)
    assert again.returncode == 0 and _changed(_summary(again)) == {}
    # A worker registered without the key (as gpunode did before 2026-12-03, and as CI caught): the
    # router cannot read its /model_info and lists its model as "unknown"; the router stage registers it again.
    router_api.remove_worker(next(w for w in router_api.workers() if w.url == WORKER2))
    _wait_router_sees(router_api, WORKER2, healthy=None)
    router_api.add_worker(WORKER2, None)
    _wait_router_sees(router_api, WORKER2, healthy=True)
    assert _model_of(router_api, WORKER2) == "unknown" and "unknown" in _models(router_api)
    mended = gpunode("router", str(FLEET), "--json", timeout=600)
    assert mended.returncode == 0, mended.stderr[-3000:]
    assert _changed(_summary(mended)) == {"router": 1}
    assert (f"worker pve-lab2 ({WORKER2}): registered again (the router listed its model as 'unknown', "
            "not 'glm-5': it had no key to read it)") in mended.stderr
    assert _models(router_api) == ["glm-5"] and _model_of(router_api, WORKER2) == "glm-5"
    running = subprocess.run(lab.ssh_command(f"docker inspect -f '{{{{.State.Running}}}}' {ROUTER_CONTAINER}",
                                             host=lab.SITE1.gpu.ip),
                             capture_output=True, text=True, timeout=60)
    assert running.stdout.strip() == "true"


def test_a_router_on_a_machine_of_its_own_reached_by_ssh(gpunode, converged: dict[str, Any], tmp_path: Path) -> None:
    """runs_on an SSH address, not a host of the file: the router stage builds the router image here,
    ships it to that machine's engine over SSH, starts the router there with both servers as workers
    and smoke-tests through it (no bench: that machine is not taken for a node holding the server
    image); the router check layer reads it there. The second site's GPU node stands in for the
    machine (it has a Docker engine and reaches both servers); what the test made there is removed."""
    data = yaml.safe_load(FLEET.read_text())
    data["router"]["runs_on"] = dict(data["hosts"][1]["container"]["ssh"])  # the second GPU node, by SSH
    own = data["router"]["runs_on"]["address"]
    assert own == lab.SITE2.gpu.ip
    path = tmp_path / "fleet-router-own.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    routed = derive.derive_router(hostfile.load(path))
    assert routed is not None and routed.reach.address == own
    # Nothing of the router there yet: what the test makes there, it removes.
    absent = f"! docker container inspect {ROUTER_CONTAINER} && ! docker image inspect {routed.image_tag}"
    assert _on_node2(absent).returncode == 0
    try:
        first = gpunode("router", str(path), "--json", timeout=900)
        assert first.returncode == 0, first.stderr[-3000:]
        summary = _summary(first)
        assert set(_changed(summary)) == {"router"} and summary["failed_hosts"] == []  # the hosts only looked
        assert ", shipped" in first.stderr  # built here, sent to the machine's engine
        assert "worker pve-lab1 (http://10.0.3.14:30000): healthy" in first.stderr
        assert f"worker pve-lab2 ({WORKER2}): healthy" in first.stderr
        assert "PASS through the router: tool_call:" in first.stderr
        assert "SKIP through the router: bench: no bench runner given" in first.stderr
        running = _on_node2(f"docker inspect -f '{{{{.State.Running}}}}' {ROUTER_CONTAINER}")
        assert running.stdout.strip() == "true", running.stderr
        own_api = RouterApi(f"http://{own}:{data['router']['port']}", lab.FLEET_API_KEY.read_text().strip())
        assert {w.url: w.healthy for w in own_api.workers()} == {"http://10.0.3.14:30000": True, WORKER2: True}
        again = gpunode("router", str(path), "--json", timeout=600)
        assert again.returncode == 0 and _changed(_summary(again)) == {}, again.stderr[-3000:]
        check = gpunode("check", str(path), "--layer", "router", "--json", timeout=300)
        results = json.loads(check.stdout)["results"]
        assert check.returncode == 0, [r for r in results if r["status"] == "fail"]
        assert {(r["host"], r["check"]) for r in results if r["status"] == "pass"} >= {
            ("router", "test_worker_healthy[pve-lab1]"), ("router", "test_worker_healthy[pve-lab2]"),
            ("router", "test_smoke_passed_through_the_router")}
    finally:
        removed = _on_node2(f"docker rm -f {ROUTER_CONTAINER}; docker rmi {routed.image_tag}; "
                            f"rm -f /etc/gpunode/router.json; {absent} >/dev/null")
        assert removed.returncode == 0, removed.stderr


class Load:
    """Requests through the router from ``threads`` threads, one after another in each, until the block
    ends, each outcome kept (its HTTP status, or the error that ended it): a chat (the stand-in answers
    it at once) and a /generate of ``tokens`` tokens (2 ms each on the stand-in) in turn, so that
    requests are in flight on the workers at any time."""

    def __init__(self, router_api: RouterApi, threads: int = 2, tokens: int = 300) -> None:
        self.api, self.threads, self.tokens = router_api, threads, tokens
        self.outcomes: list[str] = []
        self.stop = threading.Event()
        self.started = self.ended = 0.0
        self.workers: list[threading.Thread] = []

    def _send(self) -> None:
        session = requests.Session()
        session.trust_env = False
        session.headers.update(self.api.session.headers)
        chat = True
        while not self.stop.is_set():
            word = secrets.token_hex(8)
            path, body = (("/v1/chat/completions", {
                "model": "glm-5", "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False},
                "messages": [{"role": "user", "content": f"{word} What is 6 times 7?"}]}) if chat else
                ("/generate", {"text": f"{word} count", "sampling_params": {"max_new_tokens": self.tokens}}))
            chat = not chat
            try:
                reply = session.post(f"{self.api.base_url}{path}", json=body, timeout=120)
                self.outcomes.append(str(reply.status_code))
            except requests.RequestException as exc:
                self.outcomes.append(type(exc).__name__)

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        self.workers = [threading.Thread(target=self._send, daemon=True) for _ in range(self.threads)]
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.join(timeout=180)
        self.ended = time.monotonic()

    def failed(self) -> list[str]:
        return [outcome for outcome in self.outcomes if outcome != "200"]

    def said(self) -> str:
        return (f"{len(self.outcomes)} requests through the router in {self.ended - self.started:.1f} s, "
                f"{len(self.failed())} failed")


def _fleet_with(tmp_path: Path, name: str, servers: dict[str, dict[str, Any]]) -> Path:
    """The lab fleet with some hosts' server flags and env changed (host name -> {"flags": ..., "env": ...})."""
    data = yaml.safe_load(FLEET.read_text())
    for host in data["hosts"]:
        for key, values in servers.get(host["name"], {}).items():
            host["server"].setdefault(key, {}).update(values)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_change_that_restarts_every_server_rolls_one_host_at_a_time_and_every_request_succeeds(
        gpunode, converged: dict[str, Any], fleet: hostfile.HostFile, router_api: RouterApi, tmp_path: Path) -> None:
    """Day two (issue 36): a profile flag on both hosts (metrics from every scheduler) restarts both
    servers. The provision forecasts that, says so, and rolls: one host at a time taken out of the
    router, drained, changed, served, smoke-tested and put back, under a steady load through the
    router that sees no failed request. Then a change that breaks the second host's server stops
    the roll with the first host changed and serving; the second stays out of the router until its
    flag is mended, in a run that leaves the first host, rolled just before, unchanged."""
    every = {"--enable-metrics-for-all-schedulers": True}
    metrics = _fleet_with(tmp_path, "fleet-metrics.yml", {name: {"flags": every} for name in HOSTS})
    plan = gpunode("plan", str(metrics), "--live", "--json", timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    foreseen = {h["name"]: h["forecast"] for h in json.loads(plan.stdout)["hosts"]}
    assert {name: f["action"] for name, f in foreseen.items()} == {"pve-lab1": "replaced", "pve-lab2": "replaced"}
    assert foreseen["pve-lab1"]["reason"] == "changed: command"
    with Load(router_api) as load:
        result = gpunode("provision", str(metrics), "--json", timeout=1500)
    print(f"rolling change of both hosts: {load.said()}")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = _summary(result)
    roll = summary["roll"]
    print(json.dumps(roll["drained"], indent=1))
    assert roll["mode"] == "rolling" and roll["batches"] == [["pve-lab1"], ["pve-lab2"]] and roll["stopped_at"] == []
    assert "rolling (a change restarts servers that serve through the router): pve-lab1; then pve-lab2" in result.stderr
    for host in HOSTS:
        drained = roll["drained"][host]
        # Out of the router before its restart, nothing routed to it while out, nothing in flight at the
        # restart by the server's own count (/v1/loads, with the key the container holds).
        assert drained["listed"] and drained["routed_while_out"] == 0 and drained["in_flight"] == 0, drained
        assert drained["restored"] and not drained["timed_out"], drained
    assert load.failed() == [] and len(load.outcomes) >= 20, load.said()
    # Each worker is used again after its return: the router's own counters move past where they stood.
    before = {roll["drained"][host]["url"]: roll["drained"][host]["routed_before_return"] for host in HOSTS}
    for _ in range(5):
        assert _chat(router_api, 6, padding=2000) == [200] * 6
        after = _per_worker(fleet)
        if all(after[url] > count for url, count in before.items()):
            break
    assert all(after[url] > count for url, count in before.items()), (before, after)

    # The second host's change breaks its server: the roll stops there, the first host serves the new settings.
    broken = _fleet_with(tmp_path, "fleet-broken.yml", {
        "pve-lab1": {"flags": {"--enable-metrics-for-all-schedulers": True, "--max-running-requests": 512}},
        "pve-lab2": {"flags": {"--enable-metrics-for-all-schedulers": True, "--mem-fraction-static": 0.05}}})
    with Load(router_api) as load:
        stopped = gpunode("provision", str(broken), "--json", timeout=1500)
    print(f"rolling change stopped at the second host: {load.said()}")
    assert stopped.returncode == 1, stopped.stderr[-4000:]
    summary = _summary(stopped)
    assert summary["failed_hosts"] == ["pve-lab2"] and summary["roll"]["stopped_at"] == ["pve-lab2"]
    assert summary["roll"]["drained"]["pve-lab1"]["restored"] and "pve-lab2" in summary["roll"]["drained"]
    assert summary["roll"]["drained"]["pve-lab1"]["in_flight"] == 0
    assert ("rolling: stopped at pve-lab2: left out of the router; pve-lab1 changed and serving again; the hosts after "
            "it were not touched") in stopped.stderr
    assert "Not enough memory" in stopped.stderr
    assert {w.url: w.healthy for w in router_api.workers()} == {"http://10.0.3.14:30000": True}
    assert load.failed() == [], load.said()
    assert _chat(router_api, 4) == [200] * 4

    # The second host's flag mended, the first host's as the stopped roll left them: the second comes
    # back and joins the router again, and the first, rolled in the run before, changes nothing (a
    # roll leaves its hosts converged: a second run after it is idle for them).
    mended_file = _fleet_with(tmp_path, "fleet-mended.yml", {
        "pve-lab1": {"flags": {"--enable-metrics-for-all-schedulers": True, "--max-running-requests": 512}},
        "pve-lab2": {"flags": {"--enable-metrics-for-all-schedulers": True}}})
    mended = gpunode("provision", str(mended_file), "--json", timeout=1500)
    assert mended.returncode == 0, mended.stderr[-4000:]
    changed = _changed(_summary(mended))
    assert "pve-lab2-ct201" in changed and not {"pve-lab1", "pve-lab1-ct202"} & set(changed), changed
    _wait_router_sees(router_api, WORKER2, healthy=True)
    assert _chat(router_api, 4) == [200] * 4
