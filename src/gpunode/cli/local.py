"""The stage verbs that also run on this machine with --local: p2p, serve, smoke (image build is in
gpunode.cli.image)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpunode.cli.common import STAGE_CODES, app, _die, _err, _one_host, _with_codes
from gpunode.cli.options import CheckOpt, DockerUrlOpt, HostFileArg, HostOpt, JsonOpt, LimitOpt, LocalOpt, VerboseOpt
from gpunode.cli.stagerun import stage_or_local
from gpunode.ground.exitcodes import BAD_INPUT


@app.command()
def p2p(
    path: Annotated[Optional[Path], typer.Argument(help="the host file (--local: optional, for its p2p: "
                                                        "expectations and --tp-size)")] = None,
    local: LocalOpt = False,
    host: HostOpt = None,
    as_json: JsonOpt = False,
    size_mb: Annotated[Optional[int], typer.Option("--size-mb", min=1, help="--local: bytes per bandwidth "
                                                   "copy, MiB (512)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="--local: fewer samples: faster, noisier")] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """The p2p stage on the node: GPU topology and P2P bandwidth (--local: THIS machine's).

    Without --local: inside the server image on the node, the verdict recorded for `gpunode check`.
    With --local: measure this machine and print the report.
    """
    stage_or_local("p2p", path, local, {"--host": host, "--size-mb": size_mb, "--quick": quick},
                   check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    from gpunode.stages.p2p.command import run as run_p2p
    from gpunode.stages.p2p.verdict import Expectations

    if path is None and host is not None:
        _die(BAD_INPUT, ["--host picks a host of the host file: give the host file too"])
    values: dict[str, object] = {}
    if path is not None:
        chosen = _one_host(path, host)
        from gpunode.derive import derive

        values = {**chosen.p2p.model_dump(), "min_gpus": derive(chosen).tp_size}
    from gpunode.ansible_collections.gpunode.core.plugins.module_utils import pci_fabric

    # This machine's PCIe fabric for the verdict's causes (complete when run as root on the host itself).
    raise typer.Exit(run_p2p(as_json=as_json, expect=Expectations.from_mapping(values), size_mb=size_mb or 512,
                             quick=quick, out=sys.stdout, fabric=pci_fabric.gather("/")))


_with_codes(p2p, STAGE_CODES, "p2p --local")


@app.command()
def serve(
    path: HostFileArg,
    local: LocalOpt = False,
    host: HostOpt = None,
    docker_url: DockerUrlOpt = None,
    image: Annotated[Optional[str], typer.Option("--image", help="--local: image tag (default: the host file's)")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=1, help="--local: seconds to wait for "
                                                     "readiness (3600)")] = None,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The serve stage on the node: start (or keep) the SGLang server until it serves.

    Without --local: on the node's engine with the hand-off the node stage set up, waiting until
    /health_generate answers. With --local: on THIS machine's engine (or --docker-url's), choosing
    the hand-off here.
    """
    stage_or_local("serve", path, local, {"--host": host, "--docker-url": docker_url, "--image": image,
                                          "--timeout": timeout},
                   check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose,
                   json_local=False)
    chosen = _one_host(path, host)
    from gpunode.derive import server_image
    from gpunode.stages.serve.command import DEFAULT_TIMEOUT_S
    from gpunode.stages.serve.command import serve as run_serve

    raise typer.Exit(run_serve(chosen, image or server_image(chosen), docker_url, _err(), timeout or DEFAULT_TIMEOUT_S))


_with_codes(serve, STAGE_CODES, "serve --local")


@app.command()
def smoke(
    path: Annotated[Optional[Path], typer.Argument(help="the host file (not with --local)")] = None,
    local: LocalOpt = False,
    url: Annotated[Optional[str], typer.Option("--url", help="--local: the server, e.g. http://127.0.0.1:30000")] = None,
    served_name: Annotated[Optional[str], typer.Option("--served-name", help="--local: the model name clients ask "
                                                       "for (glm-5)")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(
        "--api-key-env", help="--local: environment variable holding the API key")] = None,
    bench_image: Annotated[Optional[str], typer.Option(
        "--bench-image", help="--local: run the short bench_serving from this image (needs --model-dir)")] = None,
    model_dir: Annotated[Optional[str], typer.Option("--model-dir", help="--local: model directory on the node")] = None,
    docker_url: DockerUrlOpt = None,
    as_json: JsonOpt = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """The smoke stage on the node: prove its server answers correctly (--local: the one at --url).

    Health, models, a known answer, reasoning on/off, a forced tool call (also streamed), a short
    bench with zero failed requests. Without --local the result is recorded for `gpunode check`.
    """
    stage_or_local("smoke", path, local, {"--url": url, "--served-name": served_name, "--api-key-env": api_key_env,
                                          "--bench-image": bench_image, "--model-dir": model_dir,
                                          "--docker-url": docker_url},
                   check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    import os

    from gpunode.stages.smoke.command import smoke as run_smoke

    if path is not None:
        _die(BAD_INPUT, ["smoke --local proves the server at --url: give no host file"])
    if not url:
        _die(BAD_INPUT, ["smoke --local: give the server's --url"])
    api_key = None
    if api_key_env:
        if api_key_env not in os.environ:
            _die(BAD_INPUT, [f"--api-key-env: environment variable {api_key_env} is not set"])
        api_key = os.environ[api_key_env]
    runner = None
    for_bench = [option for option, value in (("--model-dir", model_dir), ("--docker-url", docker_url)) if value]
    if for_bench and not bench_image:
        _die(BAD_INPUT, [f"{', '.join(for_bench)}: only with --bench-image (the short bench's)"])
    if bench_image:
        if not model_dir:
            _die(BAD_INPUT, ["--bench-image needs --model-dir (the tokenizer is read from the model directory)"])
        from gpunode.stages.engine import docker_client
        from gpunode.stages.smoke.bench import DockerBenchRunner

        client = docker_client(docker_url)
        runner = DockerBenchRunner(client, bench_image, model_dir)
    raise typer.Exit(run_smoke(url, served_name or "glm-5", api_key, runner, as_json, sys.stdout))


_with_codes(smoke, STAGE_CODES, "smoke --local")
