"""A provision that restarts servers behind the router, one batch of hosts at a time.

Before acting, the forecast (gpunode.rolling.forecast) reads which hosts' servers the run would
restart, and the router which of them serve now. When none of those would restart (or there is no
router, or nothing serves through it yet: a first provision), the run is the one parallel run it
always was. Otherwise, said before anything changes:

1. ``model`` and ``image`` for the hosts that roll, side by side: the weights and the new image are
   on each node before any server goes out (nothing in these stages touches a server);
2. the hosts whose servers stay, side by side, every stage but the router;
3. each batch of ``router.rolling.batch`` hosts: each host's worker taken out of the router and
   drained (gpunode.rolling.drain), every stage but the router on the batch, then each host that
   came through put back and waited for until the router reports it healthy; a batch that fails
   more than ``max_fail_percent`` of its hosts stops the roll (gpunode.rolling.order), its failed
   hosts stay out of the router and the others keep serving;
4. the router stage once at the end, when the roll went through.

``--rolling`` takes every serving host through the roll whatever the forecast says (a change the
forecast cannot see, such as a Docker restart by the node stage); ``--all-at-once`` never rolls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from gpunode.derive import ROUTER_NODE, derive_router
from gpunode.hostfile import Host, HostFile
from gpunode.rolling.drain import Drained, RouterView, drain, restore
from gpunode.rolling.forecast import Forecast, foresee
from gpunode.rolling.order import RollOrder, order, stops
from gpunode.runner import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunSummary

# The stages that run before any server goes out: they fetch and build, and touch no server.
PREPARE = ("model", "image")
# The stages whose run may restart a server: the container's (with its restart flags), the node's
# (a Docker restart) and serve's.
RESTARTING = ("container", "node", "serve")
# One runner run: (stages, the host file's names it is limited to; None: the command's own --limit).
Provision = Callable[[list[str], list[str] | None], RunSummary]


@dataclass
class Roll:
    """What the roll decided and did: the record `--json` prints under ``roll``."""

    mode: str  # rolling | one run
    why: str
    forecasts: dict[str, Forecast] = field(default_factory=dict)
    order: RollOrder | None = None
    drained: dict[str, Drained] = field(default_factory=dict)
    stopped_at: list[str] = field(default_factory=list)  # the failed hosts of the batch that stopped it
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "why": self.why, "settings": self.settings,
                "forecast": {name: {"action": f.action, "reason": f.reason} for name, f in self.forecasts.items()},
                "steady": list(self.order.steady) if self.order else [],
                "batches": [list(batch) for batch in self.order.rolling] if self.order else [],
                "drained": {name: record.as_dict() for name, record in self.drained.items()},
                "stopped_at": self.stopped_at}


def selected_hosts(hostfile: HostFile, limit: str | None) -> list[Host]:
    """The hosts a ``--limit`` (the host file's words) selects, in the file's order."""
    from gpunode.derive import node_name

    if not limit:
        return list(hostfile.hosts)
    parts = {part.strip() for part in limit.split(",")}
    return [host for host in hostfile.hosts if host.name in parts or node_name(host) in parts]


def merge(runs: list[RunSummary]) -> RunSummary:
    """The runs of one roll as one recap: stats added up per host, failures and failed hosts in order;
    the exit code is the worst one (interrupted, failed, then the highest)."""
    last = runs[-1]
    stats: dict[str, dict[str, int]] = {}
    for run in runs:
        for key, counts in run.stats.items():
            for host, number in counts.items():
                stats.setdefault(key, {})[host] = stats.get(key, {}).get(host, 0) + number
    codes = [run.exit_code for run in runs]
    exit_code = next((code for code in (EXIT_INTERRUPTED, EXIT_FAILED) if code in codes), max(codes))
    status = "successful" if exit_code == EXIT_OK else "canceled" if exit_code == EXIT_INTERRUPTED else "failed"
    return RunSummary(ident=last.ident, status=status, rc=max(run.rc for run in runs), exit_code=exit_code,
                      stages=list(dict.fromkeys(stage for run in runs for stage in run.stages)), check=last.check,
                      limit=last.limit, stats=stats, failures=[f for run in runs for f in run.failures],
                      artifacts=last.artifacts, log=last.log,
                      failed_hosts=list(dict.fromkeys(host for run in runs for host in run.failed_hosts)))


@contextlib.contextmanager
def router_view(hostfile: HostFile) -> Iterator[RouterView]:
    """The router's API and counters, through an SSH forward of its ports on the router machine."""
    from gpunode.stages.engine import forward, served_at
    from gpunode.stages.router.api import RouterApi, read_metrics, worker_requests

    router, derived = hostfile.router, derive_router(hostfile)
    assert router is not None and derived is not None
    key = router.api_key.resolve() if router.api_key is not None else None
    with forward(derived.reach, (served_at(router.bind, router.port), router.metrics_port)) as fw:
        metrics_url = f"http://{fw.at(router.metrics_port)}/metrics"
        yield RouterView(RouterApi(f"http://{fw.at(router.port)}", key),
                         lambda: worker_requests(read_metrics(metrics_url)))


def serving(hostfile: HostFile, view: RouterView) -> set[str]:
    """The hosts whose workers the router lists as healthy now."""
    derived = derive_router(hostfile)
    assert derived is not None
    healthy = {worker.url for worker in view.api.workers() if worker.healthy}
    return {worker.host for worker in derived.workers if worker.url in healthy}


@contextlib.contextmanager
def server_reader(host: Host) -> Iterator[Callable[[], int | None]]:
    """The server's own count of what it holds (gpunode.stages.serve.load), through its node's engine."""
    import docker

    from gpunode.derive.serverspec import CONTAINER_NAME
    from gpunode.stages.engine import EngineUnreachable, docker_client, forward
    from gpunode.stages.serve.load import server_in_flight

    try:
        with forward(host.container.reach) as fw:
            client = docker_client(fw.docker_url)

            def read() -> int | None:
                try:
                    return server_in_flight(client.containers.get(CONTAINER_NAME), host.server.port)
                except docker.errors.DockerException:
                    return None

            yield read
    except EngineUnreachable:
        yield lambda: None


def decide(hostfile: HostFile, stages: list[str], limit: str | None, mode: bool | None,
           container_restart: bool) -> tuple[Roll, dict[str, Host]]:
    """Whether this run rolls, and its order (``mode``: True --rolling, False --all-at-once, None
    as the forecast says); nothing is changed."""
    from gpunode.stages.engine import EngineUnreachable
    from gpunode.stages.router.api import RouterUnavailable

    hosts = {host.name: host for host in selected_hosts(hostfile, limit)}
    if mode is False:
        return Roll("one run", "--all-at-once"), hosts
    if hostfile.router is None:
        return Roll("one run", "no router: nothing to take a server out of"), hosts
    if not set(stages) & set(RESTARTING) or not hosts:
        return Roll("one run", "no stage of this run restarts a server"), hosts
    rolling = hostfile.router.rolling
    settings = {"batch": rolling.batch, "max_fail_percent": rolling.max_fail_percent,
                "drain_timeout_s": rolling.drain_timeout_s}
    try:
        with router_view(hostfile) as view:
            live = serving(hostfile, view)
    except (EngineUnreachable, RouterUnavailable) as exc:
        return Roll("one run", f"the router cannot be read, so it routes nothing to take out ({exc})"), hosts
    candidates = [name for name in hosts if name in live]
    if not candidates:
        return Roll("one run", "no host of this run serves through the router yet"), hosts
    forecasts = foresee([hosts[name] for name in candidates], container_restart)
    restarting = {name for name in candidates if mode is True or forecasts[name].restarts}
    if not restarting:
        return Roll("one run", "no serving host's server restarts", forecasts, settings=settings), hosts
    roll = Roll("rolling", "--rolling" if mode is True else "a change restarts servers that serve through the router",
                forecasts, order(list(hosts), restarting, rolling.batch), settings=settings)
    return roll, hosts


def say_plan(roll: Roll, console: Console) -> None:
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    for forecast in roll.forecasts.values():
        say(f"forecast: {forecast.line()}")
    if roll.order is None:
        say(f"one run: {roll.why}")
        return
    batches = "; then ".join(", ".join(batch) for batch in roll.order.rolling)
    say(f"rolling ({roll.why}): {batches}; each taken out of the router and drained (at most "
        f"{roll.settings['drain_timeout_s']} s), changed, served and smoke-tested, and put back before the next; "
        f"a batch stops the roll when more than {roll.settings['max_fail_percent']} % of it fails")
    if roll.order.steady:
        say(f"rolling: {', '.join(roll.order.steady)} keep their servers and are provisioned first, side by side")


def run(hostfile: HostFile, stages: list[str], limit: str | None, mode: bool | None, container_restart: bool,
        provision: Provision, console: Console) -> tuple[RunSummary, Roll]:
    """The provision of ``stages`` on the hosts ``limit`` selects, rolled where it must be (see the
    module docstring). ``provision(stages, hosts)`` is one runner run of those stages on those host
    file hosts (None: as ``limit`` says)."""
    roll, hosts = decide(hostfile, stages, limit, mode, container_restart)
    say_plan(roll, console)
    if roll.order is None:
        return provision(stages, None), roll
    runs: list[RunSummary] = []
    rolling_hosts = [name for batch in roll.order.rolling for name in batch]
    serving_stages = [name for name in stages if name != "router"]
    prepare = [name for name in stages if name in PREPARE]
    if prepare:
        runs.append(provision(prepare, rolling_hosts))
        if _stopped(roll, runs[-1], rolling_hosts, console, "preparing (model, image)"):
            return merge(runs), roll
    if roll.order.steady:
        runs.append(provision(serving_stages, list(roll.order.steady)))
        if _stopped(roll, runs[-1], list(roll.order.steady), console, "the hosts that keep their servers"):
            return merge(runs), roll
    assert hostfile.router is not None
    settings = hostfile.router.rolling
    key = hostfile.router.api_key.resolve() if hostfile.router.api_key is not None else None
    restore_s = float(hostfile.router.health_check_interval_s * 3 + 10)
    with router_view(hostfile) as view:
        derived = derive_router(hostfile)
        assert derived is not None
        urls = {worker.host: worker.url for worker in derived.workers}
        for batch in roll.order.rolling:
            for name in batch:
                with server_reader(hosts[name]) as read:
                    roll.drained[name] = drain(view, name, urls[name], read, settings.drain_timeout_s)
                console.print(f"rolling: drained {roll.drained[name].line()}", markup=False, highlight=False,
                              soft_wrap=True)
            runs.append(provision(serving_stages, list(batch)))
            failed = [name for name in batch if name in runs[-1].failed_hosts]
            for name in batch:
                if name in failed:
                    continue
                record = restore(view, roll.drained[name], key, restore_s)
                console.print(f"rolling: back {record.line()}", markup=False, highlight=False, soft_wrap=True)
                if not record.restored:
                    failed.append(name)
            if runs[-1].exit_code == EXIT_INTERRUPTED or stops(len(failed), len(batch), settings.max_fail_percent):
                roll.stopped_at = failed
                break
    if roll.stopped_at:
        _say_stop(roll, console)
    elif "router" in stages:
        runs.append(provision(["router"], [ROUTER_NODE]))
    summary = merge(runs)
    for name in roll.stopped_at:
        if name not in summary.failed_hosts:
            summary.failed_hosts.append(name)
            summary.exit_code = summary.exit_code or EXIT_FAILED
    return summary, roll


def _stopped(roll: Roll, summary: RunSummary, hosts: list[str], console: Console, what: str) -> bool:
    """A run before the first drain that failed stops the roll: nothing has been taken out yet."""
    if summary.exit_code == EXIT_OK:
        return False
    roll.stopped_at = [name for name in hosts if name in summary.failed_hosts] or list(hosts)
    console.print(f"rolling: stopped while {what}: {', '.join(roll.stopped_at)} failed; no server was taken out of "
                  "the router", markup=False, highlight=False, soft_wrap=True)
    return True


def _say_stop(roll: Roll, console: Console) -> None:
    done = [name for name, record in roll.drained.items() if record.restored]
    console.print(f"rolling: stopped at {', '.join(roll.stopped_at)}: left out of the router"
                  + (f"; {', '.join(done)} changed and serving again" if done else "")
                  + "; the hosts after it were not touched", markup=False, highlight=False, soft_wrap=True)
