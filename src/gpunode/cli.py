"""The gpunode command line. Thin: each verb maps to a playbook or a module of the package.

Heavy modules (pydantic models, ansible-runner, the lab) are imported inside the commands so that
``gpunode --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from gpunode.hostfile import Host, HostFile

AB_PRESETS_HELP = ("attention (--attention-backend flashinfer,triton)",
                   "moe (--moe-runner-backend flashinfer_cutlass,flashinfer_cutedsl)",
                   "stacks (image.stack sglang-0.5.9-cu128,sglang-0.5.23-cu130)")
EXIT_CODES_HELP = "Exit codes: 0 done, 1 a stage failed, 2 bad input, 3 host unreachable, 4 environment problem, 130 interrupted."

app = typer.Typer(
    help="Provision a Proxmox VE host with NVIDIA GPUs: LXC container, pinned SGLang image, P2P check, server.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
image_app = typer.Typer(help="The pinned server image: build it, verify it.", no_args_is_help=True)
lab_app = typer.Typer(help="The local lab: Docker, an LXC container with fake GPU device nodes, fakepve.",
                      no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.add_typer(image_app, name="image")

HostFileArg = Annotated[Path, typer.Argument(help="the host file (YAML)", show_default=False)]


def _err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _die(code: int, lines: list[str]) -> NoReturn:
    console = _err()
    for line in lines:
        console.print(f"[red]error:[/red] {line}", markup=True)
    raise typer.Exit(code)


def _load(path: Path) -> HostFile:
    from gpunode import hostfile

    try:
        return hostfile.load(path)
    except hostfile.HostFileError as exc:
        _die(2, exc.problems)


@app.command()
def validate(path: HostFileArg) -> None:
    """Check a host file and print nothing but errors (exit 2) or 'valid'."""
    hf = _load(path)
    typer.echo(f"{path}: valid ({len(hf.hosts)} host{'s' if len(hf.hosts) != 1 else ''})")


@app.command()
def plan(
    path: HostFileArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    live: Annotated[bool, typer.Option(
        "--live", help="also read (never write) the Proxmox API: is the container's vmid free, gpunode's, "
                       "or someone else's?")] = False,
) -> None:
    """Show what provision would do, without contacting anything (--live reads the Proxmox API).

    Exit codes: 0 shown, 2 bad input (or a secret --live cannot read), 3 --live: an API unreachable.
    """
    from gpunode import plan as planning
    from gpunode.render import print_plan

    hf = _load(path)
    plans = planning.make_plan(hf)
    if live:
        from gpunode.pve.client import PveError, PveUnreachable
        from gpunode.pve.live import inspect

        for index, (host, host_plan) in enumerate(zip(hf.hosts, plans)):
            try:
                host_plan.ownership = inspect(host).as_dict()
            except LookupError as exc:
                _die(2, [f"{path}: hosts[{index}].api.auth: {exc} (plan --live reads secrets from env or file)"])
            except PveUnreachable as exc:
                _die(3, [f"{host.name}: {exc}"])
            except PveError as exc:
                _die(1, [f"{host.name}: {exc}"])
    if as_json:
        typer.echo(planning.as_json(plans))
    else:
        from rich.console import Console

        print_plan(plans, Console(highlight=False, soft_wrap=True))


def _split(values: list[str] | None) -> list[str]:
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


@app.command()
def provision(
    path: HostFileArg,
    check: Annotated[bool, typer.Option("--check", help="report what would change; change nothing")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="show file and config differences")] = False,
    limit: Annotated[Optional[str], typer.Option("--limit", help="only these hosts (Ansible pattern)")] = None,
    tags: Annotated[Optional[list[str]], typer.Option("--tags", help="only these stages (comma list)")] = None,
    start: Annotated[Optional[str], typer.Option("--from", help="start at this stage, run the rest")] = None,
    restart_container: Annotated[bool, typer.Option(
        "--restart-container", help="restart a running container when device changes need it")] = False,
    recreate_container: Annotated[bool, typer.Option(
        "--recreate-container", help="re-create the container when a change needs it (DESTROYS its disk)")] = False,
    adopt: Annotated[bool, typer.Option(
        "--adopt", help="take over an existing container gpunode did not make: show the full diff, then "
                        "converge and mark it")] = False,
    vault_password_file: Annotated[Optional[Path], typer.Option(
        "--vault-password-file", help="for {vault: PATH} secrets")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the recap as JSON on stdout")] = False,
    verbose: Annotated[int, typer.Option("-v", count=True, help="more Ansible output in the log")] = 0,
) -> None:
    """Run the provision playbook: host, container, node, image, p2p, serve, smoke.

    An existing container without gpunode's tag is never changed (exit 1, naming it) unless
    --adopt is given, and never destroyed (--recreate-container refuses it even with --adopt).
    """
    from gpunode import stages as stage_list

    hf = _load(path)
    try:
        chosen = stage_list.select(_split(tags), start)
    except ValueError as exc:
        _die(2, [str(exc)])
    built = stage_list.built_stages()
    missing = [name for name in chosen if name not in built]
    if tags and missing:
        _die(2, [f"stage {name!r} is not built in this version of gpunode (built: {', '.join(built)})" for name in missing])
    chosen = [name for name in chosen if name in built]
    lab_skipped: dict[str, str] = {}
    if not tags and all(host.lab for host in hf.hosts):
        # Left out only where every host leaves it out (a stand-in on each host runs serve and smoke).
        each = [stage_list.lab_leaves_out(bool(host.image.lab_stand_in)) for host in hf.hosts]
        lab_skipped = {name: each[0][name] for name in chosen if all(name in left for left in each)}
        chosen = [name for name in chosen if name not in lab_skipped]
    if not chosen:
        _die(2, [f"no built stage selected (built: {', '.join(built)})"])
    if adopt and "container" not in chosen:
        _die(2, ["--adopt takes over a container: it needs the container stage, which is not selected"])

    from rich.console import Console

    from gpunode.runner import print_recap
    from gpunode.runner import provision as run_provision

    from gpunode.runner import SecretUnavailable, secret_files

    console = _err()
    try:
        with secret_files(hf) as secrets:
            # Said once the input is known to be good (bad input prints nothing but its error).
            for name, why in lab_skipped.items():
                console.print(f"lab: not running stage {name}: {why} "
                              f"(--tags {name} runs it anyway)", markup=False)
            summary = run_provision(
                hf, chosen, check=check, diff=diff, limit=limit, verbosity=verbose, console=console, secrets=secrets,
                extravars={"gpunode_allow_restart": restart_container, "gpunode_allow_recreate": recreate_container},
                vault_password_file=vault_password_file, source=path, adopt=adopt)
    except SecretUnavailable as exc:
        _die(2, [f"{path}: {exc}"])
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(summary), indent=2))
    else:
        print_recap(summary, Console(highlight=False))
    raise typer.Exit(summary.exit_code)


@app.command()
def check(
    path: HostFileArg,
    layers: Annotated[Optional[list[str]], typer.Option("--layer", help="only these layers (comma list)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Is this node right? testinfra checks by layer: host, container, inside, image, p2p, server.

    Exit codes: 0 every check passed (pending ones wait for a reload or reboot), 1 a check failed,
    2 bad input, 3 a host unreachable (its checks not run), 4 no check could run, 130 interrupted.
    """
    from gpunode.checks import LAYERS

    hf = _load(path)
    chosen = _split(layers)
    unknown = [layer for layer in chosen if layer not in LAYERS]
    if unknown:
        _die(2, [f"unknown layer {layer!r} (layers: {', '.join(LAYERS)})" for layer in unknown])

    from rich.console import Console

    from gpunode.check import as_json as report_json
    from gpunode.check import render, run_checks
    from gpunode.runner import SecretUnavailable, secret_files

    try:
        import pytest  # noqa: F401 - runtime dependencies of check, named if a broken install lacks them
        import testinfra  # noqa: F401
    except ImportError as exc:
        _die(4, [f"no check ran: gpunode check needs pytest and pytest-testinfra ({exc}); "
                 f"reinstall gpunode, which depends on both"])

    try:
        with secret_files(hf) as secrets:
            report = run_checks(hf, secrets, chosen or None, source=path)
    except SecretUnavailable as exc:
        _die(2, [f"{path}: {exc}"])
    if as_json:
        typer.echo(report_json(report))
    else:
        render(report, Console(highlight=False, soft_wrap=True))
    raise typer.Exit(report.exit_code)


@app.command()
def p2p(
    path: Annotated[Optional[Path], typer.Argument(help="host file for the expectations (p2p:, --tp-size)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON with every number and finding")] = False,
    size_mb: Annotated[int, typer.Option("--size-mb", help="bytes per bandwidth copy, MiB")] = 512,
    quick: Annotated[bool, typer.Option("--quick", help="fewer samples: faster, noisier")] = False,
) -> None:
    """GPU topology and P2P bandwidth on THIS machine, with a verdict for TP serving.

    Exit codes: 0 pass, 1 a pair or GPU below expectation (or P2P unavailable, or wrong data),
    2 bad input, 3 passed with fewer than two GPUs (pairs not applicable), 4 no usable GPU/NVML/CUDA.
    """
    from gpunode.p2p.command import run as run_p2p
    from gpunode.p2p.verdict import Expectations

    values: dict[str, object] = {}
    if path is not None:
        chosen = _one_host(path, host)
        from gpunode.plan import server_launch

        argv = list(server_launch(chosen).argv)
        tp = argv[argv.index("--tp-size") + 1] if "--tp-size" in argv else None
        values = {**chosen.p2p.model_dump(), "min_gpus": int(tp) if tp else None}
    raise typer.Exit(run_p2p(as_json=as_json, expect=Expectations.from_mapping(values), size_mb=size_mb,
                             quick=quick, out=sys.stdout))


def _one_host(path: Path, name: str | None):  # -> Host
    hf = _load(path)
    chosen = [h for h in hf.hosts if name in (None, h.name)]
    if not chosen or (name is None and len(chosen) > 1):
        _die(2, [f"{path}: name one host with --host ({', '.join(h.name for h in hf.hosts)})"])
    return chosen[0]


@app.command()
def serve(
    path: HostFileArg,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option(
        "--docker-url", help="Docker engine of the node (default: this machine's, DOCKER_HOST)")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="image tag (default: the host file's pinned tag)")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for readiness")] = 3600.0,
) -> None:
    """Start (or keep) the SGLang server and wait until /health_generate answers.

    Exit codes: 0 ready, 1 not ready (diagnosed from its log), 2 bad input, 4 Docker unreachable.
    """
    chosen = _one_host(path, host)
    from gpunode.plan import image_tag
    from gpunode.serve.command import serve as run_serve

    raise typer.Exit(run_serve(chosen, image or image_tag(chosen), docker_url, _err(), timeout))


@app.command()
def smoke(
    url: Annotated[str, typer.Option("--url", help="the server, e.g. http://127.0.0.1:30000")],
    served_name: Annotated[str, typer.Option("--served-name", help="the model name clients ask for")] = "glm-5",
    api_key_env: Annotated[Optional[str], typer.Option(
        "--api-key-env", help="environment variable holding the API key")] = None,
    bench_image: Annotated[Optional[str], typer.Option(
        "--bench-image", help="run the short bench_serving from this image (needs --model-dir)")] = None,
    model_dir: Annotated[Optional[str], typer.Option("--model-dir", help="model directory on the node")] = None,
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="Docker engine for the bench")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report")] = False,
) -> None:
    """Prove the server answers correctly: health, models, a known answer, reasoning on/off,
    a forced tool call (also streamed), and a short bench with zero failed requests.

    Exit codes: 0 all pass, 1 a check failed or not ready, 2 bad input, 4 the bench could not run.
    """
    import os

    from gpunode.smoke.command import smoke as run_smoke

    api_key = None
    if api_key_env:
        if api_key_env not in os.environ:
            _die(2, [f"--api-key-env: environment variable {api_key_env} is not set"])
        api_key = os.environ[api_key_env]
    runner = None
    if bench_image:
        if not model_dir:
            _die(2, ["--bench-image needs --model-dir (the tokenizer is read from the model directory)"])
        from gpunode.engine import docker_client
        from gpunode.smoke.bench import DockerBenchRunner

        client = docker_client(docker_url)
        runner = DockerBenchRunner(client, bench_image, model_dir)
    raise typer.Exit(run_smoke(url, served_name, api_key, runner, as_json, sys.stdout))


@app.command()
def diagnose(
    log: Annotated[Optional[str], typer.Argument(help="a server log file, or - for standard input")] = None,
    path: Annotated[Optional[Path], typer.Option("--hosts", help="host file: read the server container's log on the node")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    as_json: Annotated[bool, typer.Option("--json", help='print {"findings": [{"id", "summary", "cause", "fix", "line"}]}')] = False,
) -> None:
    """Name the failures in an SGLang server log, each with the line that showed it, the cause and the
    fix, ordered by where the failure began (the signatures serve uses when a start fails).

    Exit codes: 0 every failure named, or none (a healthy log), 1 a failure no signature names (its
    last error lines are shown), 2 bad input (no log given, no such file, a bad host file), 4 the
    node or its server container could not be reached.
    """
    from gpunode.serve.diagnose import findings

    if (log is None) == (path is None):
        _die(2, ["give a log file, - for standard input, or --hosts HOST_FILE for the node's server log"])
    if path is not None:
        text = _server_log(_one_host(path, host))
    elif log == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(str(log)).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            _die(2, [f"{log}: {exc.strerror or exc}"])
    found = findings(text)
    if as_json:
        typer.echo(json.dumps({"findings": [f.as_dict() for f in found]}, indent=2))
    elif not found:
        typer.echo("no failure found in the log")
    for finding in ([] if as_json else found):
        typer.echo(f"{finding.id}: {finding.summary}\n  line:  {finding.line}\n  cause: {finding.cause}\n"
                   f"  fix:   {finding.fix}")
    raise typer.Exit(1 if any(f.id == "unknown" for f in found) else 0)


def _server_log(chosen: Host) -> str:
    """The server container's log on the node, through the SSH forward to its Docker engine."""
    import docker

    from gpunode.engine import EngineUnreachable, docker_client, forward
    from gpunode.serve.spec import CONTAINER_NAME

    try:
        with forward(chosen.container.reach) as fw:
            client = docker_client(fw.docker_url)
            try:
                return str(client.containers.get(CONTAINER_NAME).logs(tail=5000).decode(errors="replace"))
            finally:
                client.close()
    except (EngineUnreachable, docker.errors.DockerException) as exc:
        _die(4, [f"cannot read {CONTAINER_NAME}'s log on {chosen.container.reach.address}: {exc}"])


@image_app.command("build")
def image_build(
    path: HostFileArg,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option(
        "--docker-url", help="engine to build on (default: the node's over SSH if image.build_on is node)")] = None,
    force: Annotated[bool, typer.Option("--force", help="build even if the content tag exists")] = False,
) -> None:
    """Build the pinned image unless its content tag exists. Exit 0 built or present, 1 failed, 2 bad input."""
    chosen = _one_host(path, host)
    from gpunode.engine import EngineUnreachable, forward
    from gpunode.image import BuildError, build
    from gpunode.plan import aot_plan

    try:
        if docker_url or chosen.image.build_on == "local":
            result = build(chosen.image, docker_url, _err(), force=force, aot=aot_plan(chosen))
        else:
            with forward(chosen.container.reach) as fw:
                result = build(chosen.image, fw.docker_url, _err(), force=force, aot=aot_plan(chosen))
    except (BuildError, EngineUnreachable) as exc:
        _die(1, [str(exc)])
    typer.echo(f"{result.tag} ({'built in %.0f s' % result.seconds if result.built else 'present, not rebuilt'})")


@image_app.command("verify")
def image_verify(
    tag: Annotated[str, typer.Argument(help="the image tag")],
    path: Annotated[Optional[Path], typer.Option("--hosts", help="host file: check its profile's launch flags")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="engine holding the image")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
) -> None:
    """Check inside the image, without a GPU: pins, CUDA 12.8, nvcc (and that it compiles for the GPUs'
    arch), patches, sm_120 kernels, the FlashInfer modules built ahead of time (those the host file's
    profile asks for, else those the image records), and the server's flags through sglang's own
    parser. Exit 0 all pass, 1 a finding failed, 2 bad input."""
    from gpunode.image import VerifyError, verify
    from gpunode.image.__main__ import default_launch_argv
    from gpunode.plan import aot_plan, server_launch

    chosen = _one_host(path, host) if path else None
    argv = list(server_launch(chosen).argv) if chosen else default_launch_argv()
    try:
        report = verify(tag, argv, docker_url, aot=aot_plan(chosen) if chosen else None)
    except VerifyError as exc:
        _die(1, [str(exc)])
    if as_json:
        typer.echo(report.to_json())
    else:
        for finding in report.findings:
            typer.echo(f"{'OK  ' if finding.ok else 'FAIL'} {finding.name}: {finding.detail}")
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def bench(
    path: HostFileArg,
    host: Annotated[Optional[str], typer.Option("--host", help="which host of the host file")] = None,
    levels: Annotated[Optional[str], typer.Option("--levels", help="concurrency list, e.g. 1,10,64,256,1024")] = None,
    input_len: Annotated[Optional[int], typer.Option("--input-len", help="random-ids input tokens")] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", help="random-ids output tokens")] = None,
    range_ratio: Annotated[float, typer.Option("--range-ratio", help="bench_serving's --random-range-ratio: 1.0 "
                                               "sends exactly the lengths given, r < 1 draws each from [N*r, N]")] = 1.0,
    ab: Annotated[Optional[str], typer.Option("--ab", help="KEY=V1,V2 (restart the server per value, sweep each), "
                                              "or a ready pair: " + ", ".join(AB_PRESETS_HELP))] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="an earlier results.jsonl to compare with")] = None,
    p2p_json: Annotated[Optional[Path], typer.Option("--p2p-json", help="`gpunode p2p --json` output, for the roofline")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="results folder")] = Path("results"),
    docker_url: Annotated[Optional[str], typer.Option("--docker-url", help="the node's Docker engine (default: "
                                                      "the node's, over SSH)")] = None,
) -> None:
    """Sweep sglang.bench_serving over concurrency levels against the node's server; write a report,
    plots and a comparison; --ab puts backends side by side. The bench runs where the server does: in
    a container from the server's image on the node's engine (over SSH), on the node's network.
    GPU power is sampled through NVML when gpunode runs on the node itself (host file ssh.connection:
    local); elsewhere the report says the node's GPUs were not sampled.

    Exit codes: 0 ok, 1 failed requests or a level >10 % worse than the baseline, 2 bad input,
    4 the bench could not run (the node or its engine unreachable).
    """
    chosen = _one_host(path, host)
    try:
        level_list = [int(v) for v in levels.split(",")] if levels else None
    except ValueError:
        _die(2, [f"--levels {levels!r}: give whole numbers separated by commas"])
    from gpunode.bench.command import AB_PRESETS, profile_defaults
    from gpunode.bench.command import bench as run_bench
    from gpunode.bench.restart import serve_restart
    from gpunode.bench.sampler import UnavailableSampler
    from gpunode.engine import EngineUnreachable, docker_client, forward
    from gpunode.plan import server_image, server_launch
    from gpunode.serve.command import probe_address
    from gpunode.serve.docker_run import ServeError
    from gpunode.smoke.bench import DockerBenchRunner
    from gpunode.stagerun import node_serve_settings

    defaults = profile_defaults(chosen.profile_name)
    tag = server_image(chosen)
    argv = list(server_launch(chosen).argv)
    tp = int(argv[argv.index("--tp-size") + 1]) if "--tp-size" in argv else 1
    api_key = chosen.server.api_key.resolve() if chosen.server.api_key else None
    # The bench container runs on the node's network: it reaches the server where the node does.
    target = f"http://{probe_address(chosen.server.bind)}:{chosen.server.port}"
    on_node = chosen.container.reach.connection == "local"
    sampler = None if on_node else UnavailableSampler(
        f"not sampled: gpunode ran on this machine, not on the node {chosen.container.reach.address} "
        "(run gpunode on the node to sample its GPUs through NVML)")
    ab = AB_PRESETS.get(ab, ab) if ab else ab

    def sweep(engine_url: str) -> int:
        runner = DockerBenchRunner(docker_client(engine_url), tag, str(chosen.model.path), server_url=target)
        restart = serve_restart(chosen, tag, engine_url, _err(), **node_serve_settings(chosen, engine_url)[0]) if ab else None
        return run_bench(target, chosen.served_name, level_list or defaults[0], input_len or defaults[1],
                         output_len or defaults[2], runner, sampler, restart, ab, baseline, out_dir,
                         api_key=api_key, tp_size=tp, p2p_json=p2p_json, range_ratio=range_ratio)

    try:
        if docker_url:
            raise typer.Exit(sweep(docker_url))
        with forward(chosen.container.reach) as fw:
            code = sweep(fw.docker_url)
    except (EngineUnreachable, ServeError) as exc:
        _die(4, [str(exc)])
    raise typer.Exit(code)


@lab_app.command("up")
def lab_up() -> None:
    """Bring the lab up (idempotent; needs root)."""
    from gpunode import lab

    try:
        info = lab.up(lambda line: _err().print(f"lab: {line}", markup=False))
    except lab.LabError as exc:
        _die(4, [str(exc)])
    nodes = ", ".join(f"{name} {numbers}" for name, numbers in info.device_nodes.items())
    typer.echo(f"lab is up ({'changed: ' + ', '.join(info.changed) if info.changed else 'no change'}, {info.seconds} s)\n"
               f"  PVE host:  {info.host_container} at {info.ssh_user}@{info.host_ip} (facts: {info.host_facts_root})\n"
               f"  GPU node:  {info.container} at {info.ssh_user}@{info.container_ip} (ssh -i {info.ssh_key})\n"
               f"  devices:   {nodes}\n"
               f"  Proxmox:   fakepve at {info.pve_url} node {info.pve_node}, CA {info.pve_ca}\n"
               f"  next:      gpunode provision inventory/lab/host.yml")


@lab_app.command("down")
def lab_down(
    purge: Annotated[bool, typer.Option("--purge", help="also delete /var/lib/gpunode-lab")] = False,
) -> None:
    """Take the lab down: container, bridge rules, fakepve."""
    from gpunode import lab

    try:
        lab.down(purge, lambda line: _err().print(f"lab: {line}", markup=False))
    except lab.LabError as exc:
        _die(4, [str(exc)])


@lab_app.command("status")
def lab_status() -> None:
    """Print the lab's state as JSON."""
    from gpunode import lab

    typer.echo(json.dumps(lab.status(), indent=2, default=str))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
