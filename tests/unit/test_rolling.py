"""The rolling change's rules and its runs, without a router or a node: the order and batch size,
Ansible's stop rules, the drain and the return against a stand-in of the router's worker API (the
real router's behaviour: stages/router/api.py and tests/lab/test_fleet.py), and the sequence of
runs, drains and returns the roll makes, with a failing host stopping it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from gpunode import hostfile
from gpunode.rolling import roll as rolling
from gpunode.rolling.drain import Drained, RouterView, drain, restore
from gpunode.rolling.forecast import Forecast
from gpunode.rolling.order import batches, order, stops
from gpunode.runner import RunSummary
from gpunode.stages.router.api import RouterApi, RouterUnavailable, RouterWorker

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"


# -- order and stop rules ---------------------------------------------------------------------------

def test_batches_keep_the_files_order_and_the_last_takes_what_is_left() -> None:
    assert batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(["a", "b"], 1) == [["a"], ["b"]]
    assert batches(["a"], 5) == [["a"]]
    with pytest.raises(ValueError, match="at least one host"):
        batches(["a"], 0)


@pytest.mark.parametrize(("failed", "size", "percent", "stop"), [
    (0, 1, 0, False),   # nothing failed
    (1, 1, 0, True),    # 0 %: the first failure stops it
    (1, 4, 0, True),
    (1, 2, 50, False),  # Ansible stops only when MORE than the percentage failed
    (2, 4, 50, False),
    (3, 4, 50, True),
    (1, 3, 34, False),
    (2, 3, 34, True),
    (2, 2, 100, True),  # every host of the batch failed: always a stop
])
def test_a_batch_stops_the_roll_as_ansibles_max_fail_percentage_does(failed: int, size: int, percent: int,
                                                                      stop: bool) -> None:
    assert stops(failed, size, percent) is stop


def test_hosts_that_keep_their_servers_are_steady_and_the_others_roll_in_the_files_order() -> None:
    roll = order(["a", "b", "c", "d"], {"d", "b", "c"}, 2)
    assert roll.steady == ("a",) and roll.rolling == (("b", "c"), ("d",)) and roll.rolls
    assert not order(["a"], set(), 1).rolls
    with pytest.raises(ValueError, match="not hosts of the file: z"):
        order(["a"], {"z"}, 1)


# -- the drain and the return, against a stand-in of the router ----------------------------------------

@dataclass
class FakeRouter:
    """The router's /workers, its per-worker counters and in-flight gauge; time moves only when the
    drain sleeps. A request in flight ends at the time it was given to end."""

    workers: dict[str, RouterWorker]
    routed: dict[str, int] = field(default_factory=dict)
    ends: dict[str, list[float]] = field(default_factory=dict)  # url -> when each request in flight ends
    now: float = 0.0
    calls: list[str] = field(default_factory=list)
    healthy_on_return: bool = True

    def api(self) -> Any:
        api = type("Api", (), {})()
        api.workers = lambda: list(self.workers.values())
        api.remove_worker = self.remove
        api.add_worker = self.add
        api.wait_gone = partial(RouterApi.wait_gone, api)
        api.wait_listed = lambda urls, healthy, timeout_s: {u for u in urls if u in self.workers
                                                             and self.workers[u].healthy}
        return api

    def remove(self, worker: RouterWorker) -> None:
        self.calls.append(f"remove {worker.url}")
        self.workers.pop(worker.url)

    def add(self, url: str, api_key: str | None) -> None:
        self.calls.append(f"add {url} {'with key' if api_key else 'without key'}")
        self.workers[url] = RouterWorker(f"id-{url}", url, self.healthy_on_return, "glm-5")

    def in_flight(self, url: str) -> int:
        return sum(1 for end in self.ends.get(url, []) if end > self.now)

    def counted(self) -> dict[str, int]:
        """The router's count per worker: each request counted once it has ended."""
        return {url: count + sum(1 for end in self.ends.get(url, []) if end <= self.now)
                for url, count in self.routed.items()}

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def view(self) -> RouterView:
        return RouterView(self.api(), self.counted, clock=lambda: self.now, sleep=self.sleep)

    def server(self, url: str = "http://10.0.3.12:30000") -> Any:
        """The server's own count of what it holds: the requests in flight there."""
        return lambda: self.in_flight(url)


URL = "http://10.0.3.12:30000"


def _router(**kwargs: Any) -> FakeRouter:
    return FakeRouter({URL: RouterWorker("w2", URL, True, "glm-5"),
                       "http://10.0.3.14:30000": RouterWorker("w1", "http://10.0.3.14:30000", True, "glm-5")},
                      routed={URL: 41}, **kwargs)


def test_a_drain_takes_the_worker_out_and_waits_until_nothing_is_in_flight() -> None:
    router = _router(ends={URL: [3.0, 5.0]})
    record = drain(router.view(), "pve-lab2", URL, router.server(), timeout_s=60)
    assert router.calls == [f"remove {URL}"] and URL not in router.workers
    # The two requests in flight end at 5 s, the router counts them then, and holds still for 2 s.
    assert record.listed and record.routed_at_removal == 43 and not record.timed_out
    assert record.in_flight == 0 and record.waited_s == 7.0
    assert "taken out of the router after 43 requests" in record.line()


def test_the_servers_own_count_holds_the_drain_even_when_the_router_is_quiet() -> None:
    router = _router()
    held = iter([2, 1, 1, 0])
    record = drain(router.view(), "pve-lab2", URL, lambda: next(held), timeout_s=60)
    assert record.waited_s == 3.0 and record.in_flight == 0


def test_a_drain_that_outlasts_its_timeout_goes_on_and_says_so() -> None:
    router = _router(ends={URL: [1000.0]})
    record = drain(router.view(), "pve-lab2", URL, router.server(), timeout_s=10)
    assert record.timed_out and record.in_flight == 1 and record.waited_s == 10.0
    assert "the drain timeout passed" in record.line() and "in flight at the restart: 1" in record.line()


def test_a_server_that_cannot_say_is_said_and_the_routers_count_must_hold_still() -> None:
    router = _router(ends={URL: [1.5]})
    record = drain(router.view(), "pve-lab2", URL, lambda: None, timeout_s=60)
    assert record.waited_s == 4.0 and record.routed_at_removal == 42  # counted at the 2 s poll, still at 4 s
    assert "the server could not say what it held" in record.note and "in flight at the restart: unread" in record.line()


def test_a_worker_the_router_does_not_list_is_not_removed() -> None:
    router = _router()
    router.workers.pop(URL)
    record = drain(router.view(), "pve-lab2", URL, lambda: 0, timeout_s=60)
    assert not record.listed and router.calls == [] and "not in the router" in record.line()


def test_a_router_that_keeps_the_worker_fails_the_drain() -> None:
    router = _router()
    api = router.api()
    api.remove_worker = lambda worker: None  # the DELETE answered, the worker stays
    view = RouterView(api, lambda: {}, clock=lambda: router.now, sleep=router.sleep)
    view.api.wait_gone = lambda urls, timeout_s: set(urls)
    with pytest.raises(RouterUnavailable, match="still lists"):
        drain(view, "pve-lab2", URL, lambda: 0, timeout_s=60)


def test_the_return_registers_with_the_key_and_counts_what_was_routed_while_out() -> None:
    router = _router()
    view = router.view()
    record = drain(view, "pve-lab2", URL, lambda: 0, timeout_s=60)
    back = restore(view, record, "-key", timeout_s=30)  # nothing sent while out
    assert router.calls[-1] == f"add {URL} with key" and back.restored and back.leaked() == 0
    assert back.as_dict()["routed_while_out"] == 0 and "back in the router" in back.line()
    leaky = Drained("pve-lab2", URL, listed=True, routed_at_removal=41)
    router.routed[URL] = 43
    assert restore(view, leaky, "-key", 30).leaked() == 2


def test_a_return_the_router_never_sees_healthy_is_not_restored() -> None:
    router = _router(healthy_on_return=False)
    view = router.view()
    back = restore(view, drain(view, "pve-lab2", URL, lambda: 0, 60), None, timeout_s=30)
    assert not back.restored and router.calls[-1] == f"add {URL} without key"
    assert "did not report it healthy within 30 s" in back.note


# -- the runs of a roll ---------------------------------------------------------------------------------

def _summary(stages: list[str], hosts: list[str] | None, failed: list[str] = ()) -> RunSummary:
    names = hosts or ["all"]
    return RunSummary(ident="x", status="failed" if failed else "successful", rc=2 if failed else 0,
                      exit_code=1 if failed else 0, stages=stages, check=False, limit=",".join(names),
                      stats={"ok": {name: 1 for name in names}, "changed": {name: 1 for name in names}},
                      failed_hosts=list(failed))


@pytest.fixture()
def fleet() -> hostfile.HostFile:
    return hostfile.load(FLEET)


def _fleet_of(tmp_path: Path, hosts: int, **rolling: Any) -> hostfile.HostFile:
    """The lab fleet with ``hosts`` hosts (copies of the second, each its own name, vmid and address)."""
    data = yaml.safe_load(FLEET.read_text())
    for index in range(2, hosts):
        extra = yaml.safe_load(yaml.safe_dump(data["hosts"][1]))
        extra["name"] = f"pve-lab{index + 1}"
        extra["container"]["vmid"] = 201 + index
        extra["container"]["hostname"] = f"gpunode-lab{index + 1}"
        extra["container"]["ssh"]["address"] = f"10.0.3.{20 + index}"
        extra["container"]["network"]["ip"] = f"10.0.3.{20 + index}/24"
        extra["ssh"]["address"] = f"10.0.3.{40 + index}"
        extra["api"]["url"] = f"https://127.0.0.{4 + index}:8006"
        data["hosts"].append(extra)
    data["router"]["rolling"] = rolling
    path = tmp_path / "fleet.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return hostfile.load(path)


@pytest.fixture()
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[str], FakeRouter]]:
    """The roll with its router and nodes replaced: every event in one list, in order."""
    events: list[str] = []
    router = FakeRouter({})

    @contextlib.contextmanager
    def view(_hostfile: Any) -> Iterator[RouterView]:
        yield router.view()

    @contextlib.contextmanager
    def server(host: Any) -> Iterator[Any]:
        yield lambda: 0

    def drained(view: RouterView, host: str, url: str, read: Any, timeout_s: float) -> Drained:
        events.append(f"drain {host}")
        return Drained(host, url, listed=True, routed_at_removal=0, in_flight=0)

    def restored(view: RouterView, record: Drained, key: str | None, timeout_s: float) -> Drained:
        events.append(f"back {record.host}")
        record.restored = record.host not in router.calls  # a host named in calls does not come back healthy
        record.healthy_after_s = 1.0
        return record

    monkeypatch.setattr(rolling, "router_view", view)
    monkeypatch.setattr(rolling, "server_reader", server)
    monkeypatch.setattr(rolling, "drain", drained)
    monkeypatch.setattr(rolling, "restore", restored)
    yield events, router


def _decided(monkeypatch: pytest.MonkeyPatch, restarting: dict[str, str]) -> None:
    """The router serves every host; the forecast restarts those named (action -> reason)."""
    monkeypatch.setattr(rolling, "serving", lambda hostfile, view: {h.name for h in hostfile.hosts})
    monkeypatch.setattr(rolling, "foresee", lambda hosts, container_restart: {
        h.name: Forecast(h.name, "replaced", restarting[h.name]) if h.name in restarting
        else Forecast(h.name, "kept", "same settings, already running") for h in hosts})


def _provision(events: list[str], failing: set[str] = frozenset(), in_stage: str = "serve") -> Any:
    """A runner run that fails the ``failing`` hosts in any run with ``in_stage`` (a broken flag: serve)."""
    def run(stages: list[str], hosts: list[str] | None) -> RunSummary:
        events.append(f"run {','.join(stages)} on {','.join(hosts) if hosts is not None else 'the limit'}")
        return _summary(stages, hosts, [h for h in hosts or [] if h in failing and in_stage in stages])
    return run


STAGES = ["host", "container", "node", "model", "image", "serve", "smoke", "router"]
SERVING = "host,container,node,model,image,serve,smoke"


def test_a_roll_drains_changes_and_returns_each_host_before_the_next(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], fleet: hostfile.HostFile) -> None:
    events, _router = runs
    _decided(monkeypatch, {"pve-lab1": "changed: command", "pve-lab2": "changed: command"})
    console = Console(file=io.StringIO(), width=300)
    summary, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events), console)
    assert events == ["run model,image on pve-lab1,pve-lab2",
                      "drain pve-lab1", f"run {SERVING} on pve-lab1", "back pve-lab1",
                      "drain pve-lab2", f"run {SERVING} on pve-lab2", "back pve-lab2",
                      "run router on router"]
    assert summary.exit_code == 0 and summary.failed_hosts == [] and roll.stopped_at == []
    assert roll.as_dict()["batches"] == [["pve-lab1"], ["pve-lab2"]] and roll.mode == "rolling"
    # Stats of the runs added up per host: two runs touched each host.
    assert summary.stats["changed"] == {"pve-lab1": 2, "pve-lab2": 2, "router": 1}
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert "forecast: pve-lab1 restarts its server (changed: command)" in said
    assert "rolling (a change restarts servers that serve through the router): pve-lab1; then pve-lab2" in said


def test_a_failing_host_stops_the_roll_stays_out_and_is_named(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], tmp_path: Path) -> None:
    events, _router = runs
    fleet = _fleet_of(tmp_path, 3)
    _decided(monkeypatch, {name: "changed: command" for name in ("pve-lab1", "pve-lab2", "pve-lab3")})
    console = Console(file=io.StringIO(), width=300)
    summary, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events, {"pve-lab2"}), console)
    assert events == ["run model,image on pve-lab1,pve-lab2,pve-lab3",
                      "drain pve-lab1", f"run {SERVING} on pve-lab1", "back pve-lab1",
                      "drain pve-lab2", f"run {SERVING} on pve-lab2"]  # not put back; pve-lab3 untouched; no router run
    assert summary.exit_code == 1 and summary.failed_hosts == ["pve-lab2"] and roll.stopped_at == ["pve-lab2"]
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert ("rolling: stopped at pve-lab2: left out of the router; pve-lab1 changed and serving again; the hosts after "
            "it were not touched") in said


def test_a_batch_within_its_fail_percentage_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                   runs: tuple[list[str], FakeRouter], tmp_path: Path) -> None:
    events, _router = runs
    fleet = _fleet_of(tmp_path, 4, batch=2, max_fail_percent=50)
    _decided(monkeypatch, {name: "changed: image" for name in ("pve-lab1", "pve-lab2", "pve-lab3", "pve-lab4")})
    summary, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events, {"pve-lab2"}),
                                Console(file=io.StringIO()))
    assert events[1:] == ["drain pve-lab1", "drain pve-lab2", f"run {SERVING} on pve-lab1,pve-lab2", "back pve-lab1",
                          "drain pve-lab3", "drain pve-lab4", f"run {SERVING} on pve-lab3,pve-lab4", "back pve-lab3",
                          "back pve-lab4", "run router on router"]
    assert summary.exit_code == 1 and summary.failed_hosts == ["pve-lab2"] and roll.stopped_at == []


def test_a_host_the_router_does_not_see_healthy_again_counts_as_failed(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], fleet: hostfile.HostFile) -> None:
    events, router = runs
    router.calls.append("pve-lab1")  # the fake's restore: pve-lab1 does not come back healthy
    _decided(monkeypatch, {"pve-lab1": "changed: command", "pve-lab2": "changed: command"})
    summary, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events),
                                Console(file=io.StringIO()))
    assert events[-1] == "back pve-lab1" and roll.stopped_at == ["pve-lab1"]
    assert summary.exit_code == 1 and summary.failed_hosts == ["pve-lab1"]


def test_hosts_that_keep_their_servers_go_first_together_and_the_others_roll(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], tmp_path: Path) -> None:
    events, _router = runs
    fleet = _fleet_of(tmp_path, 3)
    _decided(monkeypatch, {"pve-lab3": "changed: environment"})
    rolling.run(fleet, STAGES, None, None, False, _provision(events), Console(file=io.StringIO()))
    assert events == ["run model,image on pve-lab3", f"run {SERVING} on pve-lab1,pve-lab2",
                      "drain pve-lab3", f"run {SERVING} on pve-lab3", "back pve-lab3", "run router on router"]


def test_a_failure_while_preparing_stops_the_roll_before_any_drain(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], fleet: hostfile.HostFile) -> None:
    events, _router = runs
    _decided(monkeypatch, {"pve-lab1": "changed: image", "pve-lab2": "changed: image"})
    summary, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events, {"pve-lab2"}, "image"),
                                Console(file=io.StringIO()))
    assert events == ["run model,image on pve-lab1,pve-lab2"]
    assert summary.exit_code == 1 and roll.stopped_at == ["pve-lab2"]


@pytest.mark.parametrize(("mode", "restarting", "why"), [
    (None, {}, "no serving host's server restarts"),
    (False, {"pve-lab1": "changed: command"}, "--all-at-once"),
])
def test_no_roll_is_one_run_as_always(monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter],
                                      fleet: hostfile.HostFile, mode: bool | None, restarting: dict[str, str],
                                      why: str) -> None:
    events, _router = runs
    _decided(monkeypatch, restarting)
    summary, roll = rolling.run(fleet, STAGES, None, mode, False, _provision(events),
                                Console(file=io.StringIO()))
    assert events == ["run " + ",".join(STAGES) + " on the limit"] and roll.mode == "one run" and roll.why == why


def test_rolling_takes_every_serving_host_whatever_the_forecast(
        monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter], fleet: hostfile.HostFile) -> None:
    events, _router = runs
    _decided(monkeypatch, {})
    _summary_, roll = rolling.run(fleet, STAGES, None, True, False, _provision(events),
                                  Console(file=io.StringIO()))
    assert roll.why == "--rolling" and roll.as_dict()["batches"] == [["pve-lab1"], ["pve-lab2"]]


def test_nothing_serving_yet_is_one_run(monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter],
                                        fleet: hostfile.HostFile) -> None:
    events, _router = runs
    monkeypatch.setattr(rolling, "serving", lambda hostfile, view: set())
    _summary_, roll = rolling.run(fleet, STAGES, None, None, False, _provision(events),
                                  Console(file=io.StringIO()))
    assert roll.why == "no host of this run serves through the router yet" and len(events) == 1


def test_only_the_hosts_of_the_limit_roll(monkeypatch: pytest.MonkeyPatch, runs: tuple[list[str], FakeRouter],
                                          fleet: hostfile.HostFile) -> None:
    events, _router = runs
    _decided(monkeypatch, {"pve-lab1": "changed: command", "pve-lab2": "changed: command"})
    rolling.run(fleet, STAGES, "pve-lab2", None, False, _provision(events), Console(file=io.StringIO()))
    assert events[:3] == ["run model,image on pve-lab2", "drain pve-lab2", f"run {SERVING} on pve-lab2"]


def test_merge_adds_stats_and_keeps_the_worst_exit_code() -> None:
    first, second = _summary(["model"], ["a"]), _summary(["serve"], ["a", "b"], failed=["b"])
    merged = rolling.merge([first, second])
    assert merged.stats["ok"] == {"a": 2, "b": 1} and merged.exit_code == 1 and merged.status == "failed"
    assert merged.failed_hosts == ["b"] and merged.stages == ["model", "serve"]
    assert rolling.merge([first]).status == "successful"


def test_the_host_file_keeps_a_batch_that_leaves_a_host_serving(tmp_path: Path) -> None:
    fleet = _fleet_of(tmp_path, 3, batch=2, max_fail_percent=50, drain_timeout_s=60)
    assert (fleet.router.rolling.batch, fleet.router.rolling.max_fail_percent, fleet.router.rolling.drain_timeout_s) \
        == (2, 50, 60)
    with pytest.raises(hostfile.HostFileError) as refused:
        _fleet_of(tmp_path, 2, batch=2)
    assert any("router.rolling.batch: 2 takes every one of the 2 hosts out of the router at once" in problem
               for problem in refused.value.problems), refused.value.problems


def test_plan_says_the_roll_order_and_what_a_restart_does(tmp_path: Path) -> None:
    from gpunode.derive import plan

    fleet = _fleet_of(tmp_path, 3, batch=2, max_fail_percent=50, drain_timeout_s=60)
    rolling_plan = plan.router_plan(fleet)["rolling"]
    assert rolling_plan["order"] == [["pve-lab1", "pve-lab2"], ["pve-lab3"]]
    assert (rolling_plan["batch"], rolling_plan["max_fail_percent"], rolling_plan["drain_timeout_s"]) == (2, 50, 60)
    assert plan.make_plan(fleet)[0].server["restart"].startswith("a change that restarts this server goes through the roll")
    one = hostfile.load(ROOT / "inventory" / "example" / "host.yml")
    assert "stops the only server: nothing serves" in plan.make_plan(one)[0].server["restart"]
