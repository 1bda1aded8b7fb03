"""Manual use: ``python -m gpunode.image tag|build|verify``.

    python -m gpunode.image tag   [--host-file F] [--host NAME]
    python -m gpunode.image build [--host-file F] [--host NAME] [--engine URL] [--ca-bundle PEM] [--force]
    python -m gpunode.image verify TAG [--host-file F] [--host NAME] [--engine URL] [-- ARGV...]

Without a host file the image section's defaults are used (base debootstrap, the pins of
FIELD-NOTES s4) and verify checks the launch of the default profile. Exit 0 ok, 1 failed, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from gpunode import plan, profiles
from gpunode.hostfile import Host, HostFileError, Image, load
from gpunode.image import BuildError, VerifyError, build, image_tag, verify


def pick_host(host_file: Path | None, name: str | None) -> Host | None:
    if host_file is None:
        return None
    hosts = load(host_file).hosts
    for host in hosts:
        if name is None or host.name == name:
            return host
    raise SystemExit(f"no host {name!r} in {host_file}")


def image_of(host: Host | None, ca_bundle: Path | None) -> Image:
    image = host.image if host else Image()
    return image.model_copy(update={"ca_bundle": ca_bundle}) if ca_bundle else image


def default_launch_argv() -> list[str]:
    """The default profile's launch with placeholder values, for verify without a host file."""
    profile = profiles.load(Host.model_fields["server"].default.profile)
    values = {"model_dir": "/model", "served_name": profile.served_name, "bind": "127.0.0.1", "port": "30000"}
    return list(profiles.resolve(profile, values, {}, {}).argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpunode.image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tag", "build", "verify"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--host-file", type=Path)
        cmd.add_argument("--host", help="the host's name in the host file (default: the first)")
        if name != "tag":
            cmd.add_argument("--engine", help="Docker engine URL (default: the local one; ssh://user@node works)")
        if name == "build":
            cmd.add_argument("--ca-bundle", type=Path, help="extra CA bundle for a TLS-intercepting proxy")
            cmd.add_argument("--force", action="store_true", help="build even if the tag exists")
        if name == "verify":
            cmd.add_argument("tag")
            cmd.add_argument("argv", nargs="*", help="launch argv (after --); default: the host's or profile's")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        host = pick_host(args.host_file, args.host)
        aot = plan.aot_plan(host) if host else None
        if args.command == "tag":
            print(image_tag(image_of(host, None), aot=aot))
            return 0
        if args.command == "build":
            result = build(image_of(host, args.ca_bundle), args.engine, console, force=args.force, aot=aot)
            print(f'{{"tag": "{result.tag}", "built": {str(result.built).lower()}, "seconds": {result.seconds:.1f}}}')
            return 0
        launch = args.argv or (list(plan.server_launch(host).argv) if host else default_launch_argv())
        report = verify(args.tag, launch, args.engine)
        print(report.to_json())
        return 0 if report.ok else 1
    except HostFileError as exc:
        console.print(str(exc), style="red", markup=False)
        return 2
    except (BuildError, VerifyError) as exc:
        console.print(str(exc), style="red", markup=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
