"""gpunode image build (the image stage, or --local a build here) and gpunode image verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpunode.cli.common import STAGE_CODES, _die, _err, _one_host, _with_codes, image_app
from gpunode.cli.options import CheckOpt, DockerUrlOpt, HostFileArg, HostOpt, HostsFileOpt, JsonOpt, LimitOpt, LocalOpt, VerboseOpt
from gpunode.cli.stagerun import stage_or_local
from gpunode.ground.exitcodes import BAD_INPUT, FAILED, OK, UNREACHABLE


@image_app.command("build")
def image_build(
    path: HostFileArg,
    local: LocalOpt = False,
    host: HostOpt = None,
    docker_url: DockerUrlOpt = None,
    force: Annotated[bool, typer.Option("--force", help="--local: build even if the content tag exists")] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The image stage on the node: build, verify and record the server image (--local: build here).

    Without --local: built where the host file says (image.build_on), verified, the result recorded
    for `gpunode check`. With --local: built with THIS machine's engine (or --docker-url's) unless
    its content tag exists, nothing else.
    """
    stage_or_local("image", path, local, {"--host": host, "--docker-url": docker_url, "--force": force},
                   check=check, diff=False, limit=limit, vault_password_file=None, as_json=as_json, verbose=verbose)
    chosen = _one_host(path, host)
    from gpunode.derive import aot_plan
    from gpunode.stages.engine import EngineUnreachable
    from gpunode.stages.image import BuildError, build

    try:
        result = build(chosen.image, docker_url, _err(), force=force, aot=aot_plan(chosen))
    except EngineUnreachable as exc:
        _die(UNREACHABLE, [str(exc)])
    except BuildError as exc:
        _die(FAILED, [str(exc)])
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(result), indent=2, default=str))
    else:
        typer.echo(f"{result.tag} ({'built in %.0f s' % result.seconds if result.built else 'present, not rebuilt'})")


_with_codes(image_build, STAGE_CODES, "image build --local")


@image_app.command("verify")
def image_verify(
    tag: Annotated[str, typer.Argument(help="the image tag")],
    path: HostsFileOpt = None,
    host: HostOpt = None,
    docker_url: DockerUrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check inside the image, without a GPU.

    Pins, the toolchain's CUDA, nvcc (and that it compiles for the GPUs' arch), patches, sm_120
    kernels, the FlashInfer modules built ahead of time (those the host file's profile asks for,
    else those the image records), and the server's flags through sglang's own parser (the host
    file's launch, else the profile of the image's own stack).
    """
    from gpunode.derive import aot_plan, server_launch
    from gpunode.stages.image import VerifyError, verify

    if path is None and host is not None:
        _die(BAD_INPUT, ["--host picks a host of the host file: give it with --hosts"])
    chosen = _one_host(path, host) if path else None
    try:
        argv = list(server_launch(chosen).argv) if chosen else _stack_launch_argv(tag, docker_url)
        report = verify(tag, argv, docker_url, aot=aot_plan(chosen) if chosen else None)
    except VerifyError as exc:
        _die(FAILED, [str(exc)])
    if as_json:
        typer.echo(report.to_json())
    else:
        for finding in report.findings:
            typer.echo(finding.line(severity=True))
    raise typer.Exit(OK if report.ok else FAILED)


_with_codes(image_verify, "image verify")


def _stack_launch_argv(tag: str, docker_url: str | None) -> list[str]:
    """The launch of the profile of the image's own stack (its org.gpunode.stack label; an image
    without one is the default stack's), with placeholder values: verify without a host file."""
    import docker

    from gpunode.catalogue import profiles, stacks
    from gpunode.stages.engine import docker_client
    from gpunode.derive.imagecontext import LABEL_PREFIX
    from gpunode.stages.image.verify import VerifyError

    try:
        labels = docker_client(docker_url).images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        raise VerifyError(f"no image {tag} on the engine") from None
    except docker.errors.DockerException as exc:
        raise VerifyError(f"the engine cannot be reached: {exc}") from None
    profile = profiles.load(stacks.load(labels.get(f"{LABEL_PREFIX}.stack", stacks.DEFAULT)).profile)
    values = {"model_dir": "/model", "served_name": profile.served_name, "bind": "127.0.0.1", "port": "30000"}
    return list(profiles.resolve(profile, values, {}, {}).argv)
