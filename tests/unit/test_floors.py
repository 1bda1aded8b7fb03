"""The package's floors (ARCHITECTURE.md, "Floors"): every import, also one inside a function,
points down or stays on its floor, none forms a cycle, and the product never imports the lab. Read
from the source, so a lazy import cannot hide an arrow that points up."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
LAB_SRC = ROOT / "lab" / "src"
COLLECTION = "gpunode.ansible_collections.gpunode.core.plugins"

# Bottom up: a module may import its own floor and the floors below it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("gpunode", "gpunode.ground", f"{COLLECTION}.module_utils")),
    ("catalogue", ("gpunode.catalogue",)),
    ("hostfile", ("gpunode.hostfile",)),
    ("derive", ("gpunode.derive",)),
    ("stages", ("gpunode.stages",)),
    ("operations", ("gpunode.runner", "gpunode.inventory", "gpunode.render", "gpunode.checks", "gpunode.bench",
                    "gpunode.rolling",
                    f"{COLLECTION}.modules", f"{COLLECTION}.action", f"{COLLECTION}.filter", f"{COLLECTION}.strategy")),
    ("cli", ("gpunode.cli", "gpunode.__main__")),
)
# Files that run elsewhere, alone (in the server image, the probe container, the router image):
# they may import nothing of gpunode.
CONTENT = ("gpunode.images", "gpunode.probe")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(path, root): path for path in (root / package).rglob("*.py")}


PRODUCT = modules(SRC, "gpunode")
LAB = modules(LAB_SRC, "gpunode_lab")


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports, anywhere in it (relative imports resolved)."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            # from a package import a module: an arrow to the module (the package is its parent, not a target)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def floor_of(name: str) -> int:
    best, index = (-1, -1), None
    for number, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best[0]:
                best, index = (len(prefix), number), number
    if index is None:
        raise AssertionError(f"{name} is on no floor: give it one in FLOORS (and ARCHITECTURE.md)")
    return index


def graph() -> dict[str, set[str]]:
    known = {**PRODUCT, **LAB}
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_product_module_stands_on_a_floor() -> None:
    placed = [name for name in PRODUCT if not name.startswith(CONTENT)]
    assert len(placed) > 100
    for name in placed:
        floor_of(name)


def test_no_import_points_up() -> None:
    edges = graph()
    upward = sorted(f"{name} ({FLOORS[floor_of(name)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})"
                    for name, targets in edges.items() if name in PRODUCT and not name.startswith(CONTENT)
                    for target in targets if target in PRODUCT and floor_of(target) > floor_of(name))
    assert upward == [], "\n".join(upward)


def test_content_files_import_nothing_of_gpunode() -> None:
    edges = graph()
    content = [name for name in PRODUCT if name.startswith(CONTENT)]
    assert content, "no content files found: CONTENT names folders that moved"
    assert {name: sorted(edges[name]) for name in content if edges[name]} == {}


def test_the_product_never_imports_the_lab() -> None:
    edges = graph()
    assert sorted(f"{name} imports {target}" for name, targets in edges.items() if name in PRODUCT
                  for target in targets if target in LAB) == []
    assert not any(name.startswith("gpunode.lab") for name in PRODUCT)


def test_no_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target] if target in path else [name, target])
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    # A package's __init__ re-exporting its own modules is not an arrow back: skip parent <-> child.
    real = [cycle for cycle in cycles if not (len(cycle) == 3 and cycle[0].startswith(cycle[1] + ".")
                                             or len(cycle) == 3 and cycle[1].startswith(cycle[0] + "."))]
    assert real == [], "\n".join(" -> ".join(cycle) for cycle in real)


def test_the_checker_sees_an_upward_and_a_lazy_import(tmp_path: Path) -> None:
    """The rules above would pass on a checker that read nothing: it must see both kinds of arrow."""
    (tmp_path / "gpunode" / "ground").mkdir(parents=True)
    (tmp_path / "gpunode" / "__init__.py").write_text("")
    (tmp_path / "gpunode" / "ground" / "__init__.py").write_text("")
    low = tmp_path / "gpunode" / "ground" / "low.py"
    low.write_text("def f():\n    from gpunode.stages.common import Target\n    from ..derive import plan\n")
    known = {"gpunode.ground.low": low, "gpunode.stages.common": low, "gpunode.derive.plan": low}
    assert imports("gpunode.ground.low", low, known) == {"gpunode.stages.common", "gpunode.derive.plan"}
    assert floor_of("gpunode.ground.low") < floor_of("gpunode.derive.plan") < floor_of("gpunode.stages.common")


# validate loaded 645 modules, docker among them, before the floors, and 369 after (benchmarks/cli_speed.py).
# Half (322) is out of reach with these dependencies: typer, pydantic with one model, PyYAML and jinja2 (the
# plan renders the image's Dockerfile for its tag) are 303 on their own. A heavy import back fails this.
@pytest.mark.parametrize(("argv", "most"), [(["validate", "inventory/example/host.yml"], 380), (["--help"], None)])
def test_validate_and_help_load_neither_docker_ansible_runner_nor_the_lab(argv: list[str], most: int | None) -> None:
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print(sorted(m for m in ('docker', 'ansible_runner', 'gpunode_lab', 'ansible') "
            "if m in sys.modules), len(sys.modules), file=sys.stderr))\n"
            f"sys.argv = ['gpunode', *{argv!r}]\n"
            "runpy.run_module('gpunode', run_name='__main__')\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    heavy, count = done.stderr.strip().splitlines()[-1].rsplit(" ", 1)
    assert heavy == "[]"
    assert most is None or int(count) <= most, f"{count} modules"
