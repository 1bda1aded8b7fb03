"""gpunode bench: the options parsed and checked, then gpunode.bench.wiring runs the sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gpunode.cli.common import app, _die, _err, _load, _one_host, _with_codes
from gpunode.cli.options import AB_PRESETS_HELP, DockerUrlOpt, HostFileArg, HostOpt
from gpunode.ground.exitcodes import BAD_INPUT, ENVIRONMENT, UNREACHABLE


@app.command()
def bench(
    path: HostFileArg,
    host: HostOpt = None,
    levels: Annotated[Optional[str], typer.Option("--levels", help="concurrency list, e.g. 1,10,64,256,1024")] = None,
    input_len: Annotated[Optional[int], typer.Option("--input-len", min=1, help="random-ids input tokens")] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", min=1, help="random-ids output tokens")] = None,
    range_ratio: Annotated[float, typer.Option("--range-ratio", help="bench_serving's --random-range-ratio: 1.0 "
                                               "sends exactly the lengths given, r < 1 draws each from [N*r, N]")] = 1.0,
    ab: Annotated[Optional[str], typer.Option("--ab", help="KEY=V1,V2 (restart the server per value, sweep each), "
                                              "or a ready pair: " + ", ".join(AB_PRESETS_HELP))] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="an earlier results.jsonl to compare with")] = None,
    p2p_json: Annotated[Optional[Path], typer.Option("--p2p-json", help="`gpunode p2p --json` output, for the roofline")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="results folder")] = Path("results"),
    docker_url: DockerUrlOpt = None,
    router: Annotated[bool, typer.Option("--router", help="measure the fleet through the host file's router; the "
                                         "report adds each worker's requests")] = False,
) -> None:
    """Sweep sglang.bench_serving over concurrency levels against the node's server.

    Writes a report, plots and a comparison; --ab puts backends (or stacks) side by side. The bench runs where the server does: in
    a container from the server's image on the node's engine (over SSH), on the node's network.
    GPU power is sampled through NVML when gpunode runs on the node itself (host file ssh.connection:
    local); elsewhere the report says the node's GPUs were not sampled. --router sends the sweep
    through the fleet's router instead (from the router's node, or the first host's), and reads
    how many requests the router sent each worker from its metrics."""
    try:
        level_list = [int(v) for v in levels.split(",")] if levels is not None else None
    except ValueError:
        level_list = [0]
    if level_list is not None and min(level_list) < 1:  # an empty list is not the default levels
        _die(BAD_INPUT, [f"--levels {levels!r}: give whole numbers of 1 or more separated by commas"])
    sweep = {"levels": level_list, "input_len": input_len, "output_len": output_len, "range_ratio": range_ratio,
             "baseline": baseline, "p2p_json": p2p_json, "out_dir": out_dir}
    if router:
        given = [name for name, value in (("--host", host), ("--ab", ab), ("--docker-url", docker_url)) if value]
        if given:
            _die(BAD_INPUT, [f"{', '.join(given)}: not with --router (it measures the fleet as it is, through the "
                             "router)"])
        raise typer.Exit(_bench_router(path, sweep))
    chosen = _one_host(path, host)
    from gpunode.bench.wiring import node_bench
    from gpunode.catalogue.handoff import HandoffError
    from gpunode.stages.engine import EngineUnreachable

    try:
        code = node_bench(chosen, ab=ab, docker_url=docker_url, console=_err(), **sweep)
    except EngineUnreachable as exc:
        _die(UNREACHABLE, [str(exc)])
    except HandoffError as exc:
        _die(ENVIRONMENT, [f"the bench cannot restart the server: {exc}"])
    raise typer.Exit(code)


def _bench_router(path: Path, sweep: dict[str, object]) -> int:
    """`gpunode bench --router`, on a host file with a router: section."""
    from gpunode.bench.wiring import router_bench
    from gpunode.derive import derive_router
    from gpunode.stages.engine import EngineUnreachable
    from gpunode.stages.router.api import RouterUnavailable

    hf = _load(path)
    routed = derive_router(hf)
    if hf.router is None or routed is None:
        _die(BAD_INPUT, [f"{path}: --router: the host file has no router: section"])
    try:
        return router_bench(hf, routed, **sweep)  # type: ignore[arg-type]
    except EngineUnreachable as exc:
        _die(UNREACHABLE, [str(exc)])
    except RouterUnavailable as exc:
        _die(UNREACHABLE, [f"the router's metrics: {exc}"])


_with_codes(bench, "bench")
