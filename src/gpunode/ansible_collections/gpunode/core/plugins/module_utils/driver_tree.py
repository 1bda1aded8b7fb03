"""Shared by gpunode's modules and checks: the host's NVIDIA user space as a tree of its own.

The host stage builds ``<dest>/<version>/{lib64,bin}`` for the loaded driver: every library of
that version the host's ld cache lists, under its SONAME (libcuda.so.1, libnvidia-ml.so.1,
libnvidia-nvvm.so.4, ...), and the driver's tools (nvidia-smi, ...). The container gets the tree
read-only at /usr/local/nvidia (an mpN mount point), and Docker gets its files from there: one
driver, from the host down, never a second user space that can drift from the kernel module.

Plain Python (no Ansible imports): the same code runs as module_utils on the host, in the checks,
and in the unit tests over the layout recorded on an H200 (lab/src/gpunode_lab/recorded/h200/driver).
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil

TREE_ROOT = "/var/lib/gpunode/nvidia"  # on the Proxmox host: one tree per driver version
MOUNT_POINT = "/usr/local/nvidia"  # in the LXC container (an mpN mount point) and in Docker containers
MANIFEST = "gpunode-tree.json"
LD_CACHE = "/etc/ld.so.cache"
VERSION_FILE = "/sys/module/nvidia/version"
# What NVIDIA's own container tooling hands in besides the libraries (FIELD-NOTES s9); those the
# host lacks are left out.
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin")
# `ldconfig -p`: "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"
LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)(?:\s+OS ABI:[^=]*)?\s+=>\s+(\S+)\s*$")
VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


def read_version(facts_root: str = "/") -> str:
    """The loaded module's version, or '' when no NVIDIA module is loaded."""
    try:
        with open(_under(facts_root, VERSION_FILE), encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def parse_ldconfig(text: str) -> list[tuple[str, str]]:
    """(name, path) of every 64-bit x86 entry of `ldconfig -p`."""
    entries = []
    for line in text.splitlines():
        found = LDCONFIG_LINE.match(line)
        if found and "x86-64" in found.group(2):
            entries.append((found.group(1), found.group(3)))
    return entries


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def resolve(root: str, path: str, depth: int = 40) -> str:
    """``path`` (as the host sees it) with every symlink followed, kept inside ``root``; returns
    the host path (without ``root``)."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    while parts:
        if depth <= 0:
            raise OSError(f"too many levels of symbolic links under {path}")
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        here = "/" + "/".join(done + [part])
        real = _under(root, here)
        if os.path.islink(real):
            depth -= 1
            target = os.readlink(real)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                done = []
            continue
        done.append(part)
    return "/" + "/".join(done)


def plan(entries: list[tuple[str, str]], version: str, root: str = "/",
         bin_dirs: tuple[str, ...] = BIN_DIRS) -> dict[str, object]:
    """What the tree for ``version`` takes: {"version", "libraries": {soname: host path},
    "binaries": {name: host path}}.

    An ld cache entry is the driver's when the file it leads to ends in ``.so.<version>``; its
    name is then the SONAME, except a bare ``lib*.so`` (a link for linking at build time, which
    ldconfig lists too), which no driver library has as its SONAME.
    """
    libraries: dict[str, str] = {}
    for name, path in entries:
        if name.endswith(".so"):
            continue
        real = resolve(root, path)
        if real.endswith(f".so.{version}") and os.path.isfile(_under(root, real)):
            libraries.setdefault(name, real)
    binaries: dict[str, str] = {}
    for name in BINARIES:
        for folder in bin_dirs:
            real = resolve(root, f"{folder}/{name}")
            if os.path.isfile(_under(root, real)):
                binaries[name] = real
                break
    return {"version": version, "libraries": dict(sorted(libraries.items())), "binaries": binaries}


def manifest(tree_plan: dict[str, object]) -> dict[str, object]:
    """What the tree records about itself (read by the node stage, the checks and the CDI spec)."""
    return {"version": tree_plan["version"], "libraries": sorted(tree_plan["libraries"]),  # type: ignore[arg-type]
            "binaries": sorted(tree_plan["binaries"]),  # type: ignore[arg-type]
            "sources": {**{f"lib64/{k}": v for k, v in tree_plan["libraries"].items()},  # type: ignore[attr-defined]
                        **{f"bin/{k}": v for k, v in tree_plan["binaries"].items()}}}  # type: ignore[attr-defined]


def _same(source: str, target: str) -> bool:
    try:
        return os.path.samefile(source, target) or filecmp.cmp(source, target, shallow=False)
    except OSError:
        return False


def _place(source: str, target: str) -> None:
    """A hard link where the tree and the driver share a file system (no space used; a driver
    update writes new inodes, so the old tree keeps the old files), else a copy."""
    tmp = f"{target}.gpunode-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copy2(source, tmp)
    os.replace(tmp, target)


def build(tree_plan: dict[str, object], root: str = "/", dest: str = TREE_ROOT,
          check_mode: bool = False) -> list[str]:
    """Make ``dest/<version>`` hold exactly the plan; returns what changed (empty: nothing)."""
    version = str(tree_plan["version"])
    if not VERSION.match(version):
        raise ValueError(f"not a driver version: {version!r}")
    tree = os.path.join(dest, version)
    wanted = {f"lib64/{k}": v for k, v in tree_plan["libraries"].items()}  # type: ignore[attr-defined]
    wanted.update({f"bin/{k}": v for k, v in tree_plan["binaries"].items()})  # type: ignore[attr-defined]
    changes: list[str] = []
    for rel, source in sorted(wanted.items()):
        target = os.path.join(tree, rel)
        if not _same(_under(root, source), target):
            changes.append(f"{rel} <- {source}")
            if not check_mode:
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                _place(_under(root, source), target)
    for sub in ("lib64", "bin"):
        folder = os.path.join(tree, sub)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if f"{sub}/{name}" not in wanted:
                changes.append(f"{sub}/{name} removed (not part of driver {version})")
                if not check_mode:
                    os.unlink(os.path.join(folder, name))
    text = json.dumps(manifest(tree_plan), indent=1, sort_keys=True) + "\n"
    path = os.path.join(tree, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            same = handle.read() == text
    except OSError:
        same = False
    if not same:
        changes.append(MANIFEST)
        if not check_mode:
            os.makedirs(tree, mode=0o755, exist_ok=True)
            with open(f"{path}.gpunode-tmp", "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(f"{path}.gpunode-tmp", path)
    return changes


def trees(dest: str = TREE_ROOT) -> list[str]:
    """Versions with a tree gpunode made (a manifest marks it as gpunode's)."""
    if not os.path.isdir(dest):
        return []
    return sorted(name for name in os.listdir(dest) if os.path.isfile(os.path.join(dest, name, MANIFEST)))


def prune(keep: list[str], dest: str = TREE_ROOT, check_mode: bool = False) -> list[str]:
    """Remove gpunode's trees whose version is not in ``keep`` (the loaded driver and whatever a
    container still mounts, live or pending); returns the versions removed."""
    gone = [version for version in trees(dest) if version not in keep]
    if not check_mode:
        for version in gone:
            shutil.rmtree(os.path.join(dest, version))
    return gone


def survey(facts_root: str = "/", dest: str = TREE_ROOT) -> dict[str, object]:
    """For the checks: the loaded version, and what building its tree would change (nothing when
    the tree is whole), with `ldconfig -p` run here."""
    import subprocess

    version = read_version(facts_root)
    if not version:
        return {"version": "", "changes": [], "trees": trees(dest)}
    cache = _under(facts_root, LD_CACHE)
    listed = subprocess.run(["ldconfig", "-p", "-C", cache], capture_output=True, text=True, check=True).stdout
    tree_plan = plan(parse_ldconfig(listed), version, facts_root)
    return {"version": version, "path": os.path.join(dest, version), "trees": trees(dest),
            "changes": build(tree_plan, facts_root, dest, check_mode=True)}
