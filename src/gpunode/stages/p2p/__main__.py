"""``python3 -m gpunode.stages.p2p``: the check stand-alone (argparse only: it runs in the server image)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpunode.ground.text import shown
from gpunode.stages.p2p.command import DEFAULT_SIZE_MB, run
from gpunode.stages.p2p.verdict import EXIT_BAD_INPUT, EXIT_CODES, Expectations


def _parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())
    parser = argparse.ArgumentParser(
        prog="python3 -m gpunode.stages.p2p",
        description="GPU topology and peer-to-peer bandwidth check: can this node serve with TP across its GPUs?",
        epilog=f"exit codes:\n{codes}", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON with every number and finding")
    parser.add_argument("--size-mb", type=int, default=DEFAULT_SIZE_MB,
                        help=f"bytes per bandwidth copy, MiB (default {DEFAULT_SIZE_MB})")
    parser.add_argument("--quick", action="store_true", help="fewer samples: a faster, noisier check")
    parser.add_argument("--expect-file", type=Path,
                        help="YAML: a host file (its p2p: section), a p2p: mapping, or the expectation keys")
    parser.add_argument("--host", help="which host of --expect-file (default: the only one)")
    parser.add_argument("--same-numa-gbps", type=float, help="minimum unidirectional GB/s within a NUMA node (45)")
    parser.add_argument("--cross-numa-gbps", type=float, help="minimum unidirectional GB/s across NUMA nodes (35)")
    parser.add_argument("--nvlink-gbps", type=float, help="minimum unidirectional GB/s over NVLink (100)")
    parser.add_argument("--not-required", action="store_true",
                        help="report P2P problems as warnings, not failures (host file: required: false)")
    parser.add_argument("--min-gpus", type=int, help="fail when fewer GPUs are measured (e.g. the TP size)")
    parser.add_argument("--fabric-file", type=Path,
                        help="JSON: the host's PCIe fabric facts (gpunode.core.nvidia_host_facts' fabric, or facts "
                             "holding it) for the verdict's causes; default: read this machine's sysfs")
    return parser


PATH_MAX = 4096  # a path is shown whole (escapes written out), as long as the kernel allows one


def _path(path: Path) -> str:
    """A path from the command line inside a message: inert (escape sequences written out), whole."""
    return shown(str(path), PATH_MAX)


def _p2p_section(path: Path, host: str | None) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{_path(path)}: not valid YAML: {shown(str(exc), PATH_MAX)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{_path(path)}: not a YAML mapping")
    if "hosts" in data:
        hosts = [h for h in data["hosts"] or [] if isinstance(h, dict)]
        chosen = [h for h in hosts if host is None or h.get("name") == host]
        if len(chosen) != 1:
            names = ", ".join(shown(h.get("name")) for h in hosts)
            raise ValueError(f"{_path(path)}: name one host with --host (hosts: {names})")
        data = chosen[0].get("p2p") or {}
    elif "p2p" in data:
        data = data["p2p"] or {}
    if not isinstance(data, dict):
        raise ValueError(f"{_path(path)}: p2p: is not a mapping")
    return data


def expectations(args: argparse.Namespace) -> Expectations:
    values: dict[str, Any] = _p2p_section(args.expect_file, args.host) if args.expect_file else {}
    overrides = {"same_numa_gbps": args.same_numa_gbps, "cross_numa_gbps": args.cross_numa_gbps,
                 "nvlink_gbps": args.nvlink_gbps, "min_gpus": args.min_gpus}
    values.update({key: value for key, value in overrides.items() if value is not None})
    if args.not_required:
        values["required"] = False
    return Expectations.from_mapping(values)


MAX_FABRIC_BYTES = 4 * 2**20  # a fabric of 8 GPUs is a few kB: anything this large is not one


def fabric_facts(path: Path | None) -> dict[str, Any]:
    """The fabric facts from ``--fabric-file`` (raises ValueError naming what is wrong), or this
    machine's own, read from its sysfs and /proc (inside a container, usually incomplete: the verdict
    then says so rather than guess)."""
    import json

    from gpunode.ansible_collections.gpunode.core.plugins.module_utils import pci_fabric

    if path is None:
        return pci_fabric.gather("/")

    if not path.is_file():
        raise ValueError(f"--fabric-file {_path(path)}: not a regular file")
    with path.open("rb") as handle:
        raw = handle.read(MAX_FABRIC_BYTES + 1)
    if len(raw) > MAX_FABRIC_BYTES:
        raise ValueError(f"--fabric-file {_path(path)}: larger than {MAX_FABRIC_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"--fabric-file {_path(path)}: not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"--fabric-file {_path(path)}: not JSON (nested too deeply)") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):  # a registered nvidia_host_facts result
        data = data["facts"]
    if isinstance(data, dict) and isinstance(data.get("fabric"), dict):  # the facts module's output
        data = data["fabric"]
    shape = pci_fabric.shape_problem(data)
    if shape:
        raise ValueError(f"--fabric-file {_path(path)}: not fabric facts ({shape})")
    return data


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        expect = expectations(args)
        fabric = fabric_facts(args.fabric_file)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run(as_json=args.json, expect=expect, size_mb=args.size_mb, quick=args.quick, out=sys.stdout,
               fabric=fabric)


if __name__ == "__main__":
    sys.exit(main())
