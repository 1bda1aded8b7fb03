"""``gpunode bench`` wired to a host file: the runner (a bench_serving container on the node's
engine), the sampler, the restart for an A/B, then ``command.bench``. The command line parses and
checks its options and calls one of these, mapping what they raise to exit codes:
``EngineUnreachable`` (the node or its engine), ``HandoffError`` (an A/B restart cannot hand the
GPUs over), ``RouterUnavailable`` (the router's metrics).

Heavy modules (docker, pydantic models) are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from gpunode.derive import RouterDerived
    from gpunode.hostfile import Host, HostFile


def node_bench(host: Host, *, levels: Sequence[int] | None, input_len: int | None, output_len: int | None,
               range_ratio: float, ab: str | None, baseline: Path | None, p2p_json: Path | None, out_dir: Path,
               docker_url: str | None, console: Console) -> int:
    """The sweep (or the A/B: ``ab`` a preset's name or KEY=V1,V2) against ``host``'s server, from a
    container of its image on the node's engine (``docker_url``, else the node's over SSH). GPUs
    are sampled only when gpunode runs on the node itself. Returns command.bench's exit code."""
    from gpunode.bench.command import AB_PRESETS, profile_defaults
    from gpunode.bench.command import bench as run_bench
    from gpunode.bench.restart import serve_restart
    from gpunode.bench.sampler import UnavailableSampler
    from gpunode.derive import derive
    from gpunode.stages.common import Target
    from gpunode.stages.engine import docker_client, forward
    from gpunode.stages.serve.command import probe_address
    from gpunode.stages.serve.stage import node_settings
    from gpunode.stages.smoke.bench import DockerBenchRunner

    defaults = profile_defaults(host.profile_name)
    derived = derive(host)
    tag, tp = derived.server_image, derived.tp_size
    api_key = host.server.api_key.resolve() if host.server.api_key else None
    # The bench container runs on the node's network: it reaches the server where the node does.
    target = f"http://{probe_address(host.server.bind)}:{host.server.port}"
    on_node = host.container.reach.connection == "local"
    sampler = None if on_node else UnavailableSampler(
        f"not sampled: gpunode ran on this machine, not on the node {host.container.reach.address} "
        "(run gpunode on the node to sample its GPUs through NVML)")
    ab = AB_PRESETS.get(ab, ab) if ab else ab

    def sweep(engine_url: str) -> int:
        runner = DockerBenchRunner(docker_client(engine_url), tag, str(host.model.path), server_url=target)
        settings = node_settings(Target(host, derived), engine_url)[0] if ab else {}
        restart = serve_restart(host, tag, engine_url, console, **settings) if ab else None
        return run_bench(target, host.served_name, levels or defaults[0], input_len or defaults[1],
                         output_len or defaults[2], runner, sampler, restart, ab, baseline, out_dir,
                         api_key=api_key, tp_size=tp, p2p_json=p2p_json, range_ratio=range_ratio)

    if docker_url:
        return sweep(docker_url)
    with forward(host.container.reach) as fw:
        return sweep(fw.docker_url)


def router_bench(hf: HostFile, routed: RouterDerived, *, levels: Sequence[int] | None, input_len: int | None,
                 output_len: int | None, range_ratio: float, baseline: Path | None, p2p_json: Path | None,
                 out_dir: Path) -> int:
    """`gpunode bench --router`: the sweep through the router of ``hf`` (which has one), from a node
    holding the server image and the model's tokenizer (the router's own, else the first host's),
    with the router's per-worker request counts read over SSH from its metrics port."""
    from gpunode.bench.command import bench as run_bench
    from gpunode.bench.command import profile_defaults
    from gpunode.bench.sampler import UnavailableSampler
    from gpunode.derive import derive
    from gpunode.stages.engine import docker_client, forward
    from gpunode.stages.router.api import read_metrics, worker_requests
    from gpunode.stages.serve.command import probe_address
    from gpunode.stages.smoke.bench import DockerBenchRunner

    router = hf.router
    assert router is not None
    node = hf.router_host or hf.hosts[0]
    url = (f"http://{probe_address(router.bind)}:{router.port}" if node is hf.router_host else routed.url)
    derived = derive(node)
    defaults = profile_defaults(node.profile_name)
    names = {w.url: f"{w.host} ({w.url})" for w in routed.workers}
    sampler = UnavailableSampler("not sampled: through the router the fleet's GPUs are on several nodes")
    api_key = router.api_key.resolve() if router.api_key else None
    with forward(routed.reach, (router.metrics_port,)) as metrics, forward(node.container.reach) as fw:
        metrics_url = f"http://127.0.0.1:{metrics.ports[router.metrics_port]}/metrics"

        def workers() -> dict[str, int]:
            counts = worker_requests(read_metrics(metrics_url))
            return {names.get(u, u): counts.get(u, 0) for u in [*names, *sorted(set(counts) - set(names))]}

        runner = DockerBenchRunner(docker_client(fw.docker_url), derived.server_image, str(node.model.path),
                                   server_url=url)
        return run_bench(url, routed.served_name, levels or defaults[0], input_len or defaults[1],
                         output_len or defaults[2], runner, sampler, None, None, baseline, out_dir,
                         api_key=api_key, tp_size=derived.tp_size, p2p_json=p2p_json, range_ratio=range_ratio,
                         workers=workers)
