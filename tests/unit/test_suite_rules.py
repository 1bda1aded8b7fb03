"""Rules the test suite keeps (issue #38), checked on the test sources' syntax trees:

- no wall-clock bound under 5 s: a loaded 2-core machine running two xdist workers misses tight
  margins; tests assert order and counts (through the code's own clock or events) and speed is
  measured under benchmarks/. CPU time (time.process_time) is not wall-clock time and may be bounded;
  so may timestamps read from a recording, with ``# not wall-clock: <why>`` on the line.
- no ``pytest.importorskip`` of a package pyproject.toml declares: a broken install of a declared
  dependency must fail, not skip.
- free ports come from tests/fakes/ports.py only (a port picked by bind-then-close can be taken by
  the other worker before the server binds it), and ``CI`` is read only by tests/fakes/ci.py.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
BOUND_S = 5.0  # the shortest wall-clock bound a test may assert
PORTS_HELPER = TESTS / "fakes" / "ports.py"
CI_HELPER = TESTS / "fakes" / "ci.py"

# Wall clocks (time.process_time, CPU time, is left out on purpose).
CLOCKS = frozenset({"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"})
# Words that name a duration or a moment in this project's tests; a trailing "_s"/"_ms" means seconds.
TIME_WORDS = frozenset({"elapsed", "gap", "gaps", "duration", "durations", "latency", "took", "spent", "seconds",
                        "secs", "delay", "deadline", "began", "started", "start", "t0", "tick", "ticks"})
TIME_ATTRIBUTES = frozenset({"t"})  # a sample's timestamp (gpunode.bench.sampler.Sample.t)
RATE_WORDS = frozenset({"tok", "token", "tokens", "req", "reqs", "requests", "per", "bytes", "ops"})  # tok_s: a rate
# A bound on timestamps that were recorded, not measured by the test, says so on its line.
EXEMPT = re.compile(r"#\s*not wall-clock:\s*\S")
UPPER = (ast.Lt, ast.LtE)
LOWER = (ast.Gt, ast.GtE)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def suite_sources() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def _words(identifier: str) -> list[str]:
    return [w for w in re.split(r"_+", identifier.lower()) if w]


def _time_named(identifier: str, attribute: bool) -> bool:
    words = _words(identifier)
    if not words:
        return False
    if attribute and identifier in TIME_ATTRIBUTES:
        return True
    seconds = len(words) > 1 and words[-1] in ("s", "ms") and words[-2] not in RATE_WORDS
    return seconds or any(w in TIME_WORDS for w in words)


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        # time.time() only on the time module: .time() elsewhere is too common a name.
        return func.attr in CLOCKS and (func.attr != "time" or (isinstance(func.value, ast.Name)
                                                                 and func.value.id == "time"))
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _numeric(node: ast.AST, constants: dict[str, float]) -> float | None:
    """The value of a numeric literal, a module constant, or arithmetic of those; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _numeric(node.operand, constants)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _numeric(node.left, constants), _numeric(node.right, constants)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right if right else None
    return None


def _module_constants(tree: ast.Module) -> dict[str, float]:
    constants: dict[str, float] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = _numeric(stmt.value, constants)
            if value is not None:
                constants[stmt.targets[0].id] = value
    return constants


def _assignments(scope: ast.AST) -> dict[str, list[ast.AST]]:
    """Name -> the expressions assigned to it in ``scope`` (nested functions included: a closure
    reads its parent's names, and a name reused for something else only widens what counts)."""
    found: dict[str, list[ast.AST]] = {}

    def bind(target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            found.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(
                target.elts) else [value] * len(target.elts)
            for part, part_value in zip(target.elts, values):
                bind(part, part_value)
        elif isinstance(target, ast.Starred):
            bind(target.value, value)

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, ast.NamedExpr):
            bind(node.target, node.value)
        elif isinstance(node, (ast.For, ast.comprehension)):
            bind(node.target, node.iter)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, item.context_expr)
    return found


class _Timing:
    """Whether an expression is a wall-clock quantity, following the names assigned in its scope."""

    def __init__(self, assigned: dict[str, list[ast.AST]]) -> None:
        self.assigned = assigned
        self.memo: dict[str, bool] = {}

    def __call__(self, node: ast.AST) -> bool:
        return self._timed(node, frozenset())

    def _timed(self, node: ast.AST, seen: frozenset[str]) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            return False  # a count of things, even of timestamps, is not a duration
        if _is_clock_call(node):
            return True
        if isinstance(node, ast.Attribute):
            return _time_named(node.attr, attribute=True) or self._timed(node.value, seen)
        if isinstance(node, ast.Name):
            return self._name(node.id, seen)
        return any(self._timed(child, seen) for child in ast.iter_child_nodes(node))

    def _name(self, name: str, seen: frozenset[str]) -> bool:
        if _time_named(name, attribute=False):
            return True
        if name in seen:
            return False
        if name not in self.memo:
            self.memo[name] = any(self._timed(value, seen | {name}) for value in self.assigned.get(name, []))
        return self.memo[name]


def _scopes(tree: ast.Module) -> Iterator[ast.AST]:
    """The module and each top-level function or class: each a scope for names."""
    yield tree
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield stmt


def _own_nodes(scope: ast.AST, tree: ast.Module) -> Iterator[ast.AST]:
    if scope is not tree:
        yield from ast.walk(scope)
        return
    for stmt in tree.body:  # module level, outside functions and classes
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from ast.walk(stmt)


def wall_clock_bounds(source: str, path: str = "<test>") -> list[Finding]:
    """Every upper bound under BOUND_S on a wall-clock quantity (``elapsed < 2``, ``max(gaps) < 0.16``,
    ``time.monotonic() - t0 <= 0.5``, ``0.05 > first.t``) and every deadline under it
    (``time.monotonic() + 2``)."""
    tree = ast.parse(source)
    constants = _module_constants(tree)
    lines = source.splitlines()
    findings: list[Finding] = []

    def exempt(node: ast.AST) -> bool:
        end = getattr(node, "end_lineno", None) or node.lineno
        return any(EXEMPT.search(line) for line in lines[node.lineno - 1:end])

    for scope in _scopes(tree):
        timed = _Timing(_assignments(scope))
        for node in _own_nodes(scope, tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for left, op, right in zip(operands, node.ops, operands[1:]):
                    if isinstance(op, UPPER):
                        quantity, limit = left, _numeric(right, constants)
                    elif isinstance(op, LOWER):
                        quantity, limit = right, _numeric(left, constants)
                    else:
                        continue
                    if limit is not None and limit < BOUND_S and _numeric(quantity, constants) is None \
                            and timed(quantity) and not exempt(node):
                        findings.append(Finding(path, node.lineno, f"wall-clock bound of {limit:g} s: "
                                                                   f"`{ast.unparse(node)}`"))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                for clock, offset in ((node.left, node.right), (node.right, node.left)):
                    limit = _numeric(offset, constants)
                    if _is_clock_call(clock) and limit is not None and limit < BOUND_S and not exempt(node):
                        findings.append(Finding(path, node.lineno, f"wall-clock deadline of {limit:g} s: "
                                                                   f"`{ast.unparse(node)}`"))
    return sorted(set(findings), key=lambda f: (f.path, f.line, f.what))


# -- importorskip of a declared dependency --------------------------------------------------------
def declared_distributions(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return {canonicalize_name(Requirement(spec).name) for spec in specs}


def distributions_of(module: str) -> set[str]:
    """The distributions that install ``module`` (pynvml -> nvidia-ml-py); by its own name as well,
    for a declared package that is missing or broken here (the case importorskip would hide)."""
    top = module.split(".")[0]
    installed = importlib.metadata.packages_distributions().get(top, [])
    return {canonicalize_name(name) for name in installed} | {canonicalize_name(top)}


def declared_importorskips(source: str, declared: set[str], path: str = "<test>") -> list[Finding]:
    findings = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name != "importorskip" or not node.args:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            findings.append(Finding(path, node.lineno, f"importorskip of a computed name: `{ast.unparse(node)}`"))
            continue
        hits = distributions_of(first.value) & declared
        if hits:
            findings.append(Finding(path, node.lineno, f"importorskip({first.value!r}) of a declared dependency "
                                                       f"({', '.join(sorted(hits))}): import it plainly"))
    return sorted(findings, key=lambda f: f.line)


# -- port pickers and CI readers outside their helpers --------------------------------------------
def port_pickers(source: str, path: str = "<test>") -> list[Finding]:
    """``sock.bind((host, 0))``: a port picked by the kernel outside tests/fakes/ports.py."""
    findings = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind" \
                and node.args and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) >= 2 \
                and isinstance(node.args[0].elts[1], ast.Constant) and node.args[0].elts[1].value == 0:
            findings.append(Finding(path, node.lineno, f"free port picked here: `{ast.unparse(node)}` "
                                                       "(use tests/fakes/ports.py)"))
    return sorted(findings, key=lambda f: f.line)


def ci_readers(source: str, path: str = "<test>") -> list[Finding]:
    """``os.environ.get("CI")``, ``os.environ["CI"]``, ``os.getenv("CI")``, ``"CI" in os.environ``."""
    findings = []
    for node in ast.walk(ast.parse(source)):
        read = False
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "CI" and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "getenv", "pop", "setdefault"):
            read = True
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "CI":
            read = True
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and node.left.value == "CI" \
                and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            read = True
        if read:
            findings.append(Finding(path, node.lineno, f"CI read here: `{ast.unparse(node)}` "
                                                       "(use tests/fakes/ci.py under_ci())"))
    return sorted(findings, key=lambda f: f.line)


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the rules on the tree --------------------------------------------------------------------------
def test_no_wall_clock_bound_under_5_s_in_tests() -> None:
    sources = suite_sources()
    assert len(sources) > 50  # the walk found the suite, not an empty folder
    found = [f for path in sources for f in wall_clock_bounds(path.read_text(), _relative(path))]
    assert not found, "assert order and counts, measure speed in benchmarks/:\n" + "\n".join(map(str, found))


def test_no_importorskip_of_a_declared_dependency() -> None:
    declared = declared_distributions()
    assert {"matplotlib", "nvidia-ml-py", "pytest-xdist"} <= declared
    found = [f for path in suite_sources() for f in declared_importorskips(path.read_text(), declared, _relative(path))]
    assert not found, "\n".join(map(str, found))


def test_free_ports_come_from_the_ports_helper() -> None:
    found = [f for path in suite_sources() if path != PORTS_HELPER
             for f in port_pickers(path.read_text(), _relative(path))]
    assert not found, "\n".join(map(str, found))
    assert port_pickers(PORTS_HELPER.read_text()), "the helper itself binds to port 0"


def test_ci_is_read_by_the_ci_helper_only() -> None:
    found = [f for path in suite_sources() if path != CI_HELPER for f in ci_readers(path.read_text(), _relative(path))]
    assert not found, "\n".join(map(str, found))
    assert ci_readers(CI_HELPER.read_text()), "the helper itself reads CI"


# -- the checkers catch what they are for (and leave alone what is allowed) -------------------------
CAUGHT = {
    "elapsed": "import time\ndef test():\n    start = time.monotonic()\n    run()\n    elapsed = time.monotonic() - start\n"
               "    assert elapsed < 2\n",
    "inline": "import time\ndef test():\n    t0 = time.perf_counter()\n    run()\n    assert time.perf_counter() - t0 < 0.5\n",
    "gaps": "import itertools\ndef test():\n    ticks = sorted({s.t for s in result.samples})\n"
            "    gaps = [b - a for a, b in itertools.pairwise(ticks)]\n    assert max(gaps) < 0.16\n",
    "first sample": "def test():\n    assert min(s.t for s in second.samples) < 0.05\n",
    "events": "def test():\n    fired = next(e.at_s for e in result.events if e.phase == 'fired_up')\n"
              "    ready = next(e.at_s for e in result.events if e.phase == 'ready')\n    assert ready - fired < 2.0\n",
    "reversed": "import time\ndef test():\n    began = time.monotonic()\n    assert 1.5 >= time.monotonic() - began\n",
    "chained": "def test():\n    assert 0 <= result.elapsed_s <= 3\n",
    "constant": "LIMIT = 0.5 * 2\ndef test():\n    assert result.duration_s < LIMIT\n",
    "from import": "from time import monotonic\ndef test():\n    x = monotonic()\n    assert monotonic() - x < 1\n",
    "deadline": "import time\ndef wait():\n    deadline = time.monotonic() + 2\n",
    "closure": "import time\ndef test():\n    began = time.monotonic()\n    def check():\n"
               "        assert time.monotonic() - began < 0.1\n",
    "module level": "import time\nSTART = time.monotonic()\nassert time.monotonic() - START < 1\n",
}
ALLOWED = {
    "five seconds": "import time\ndef test():\n    began = time.monotonic()\n    assert time.monotonic() - began < 5.0\n",
    "lower bound": "def test():\n    assert result.duration_s >= 0.6\n",
    "cpu time": "import time\ndef test():\n    cpu = time.process_time()\n    run()\n"
                "    assert time.process_time() - cpu < 0.5\n",
    "a count": "def test():\n    assert len(ticks) <= 14 and len(result.samples) < 3\n",
    "not time": "def test():\n    assert code < 2 and len(lines) < 4 and ratio <= 0.5\n",
    "long deadline": "import time\ndef wait():\n    deadline = time.monotonic() + 10\n",
    "equality": "def test():\n    assert [s.t for s in samples] == [0.0, 0.05]\n",
    "a rate": "def test():\n    assert abs(r.ceiling_tok_s / SEEDS_TOK_S - 1) < 0.04\n",
    "recorded": "def test():\n    gaps = recorded_gaps()\n    assert max(gaps) < 0.102  # not wall-clock: a recording\n",
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_the_bound_check_catches(name: str) -> None:
    found = wall_clock_bounds(CAUGHT[name], "snippet.py")
    assert len(found) == 1 and str(found[0]).startswith("snippet.py:"), found


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_the_bound_check_allows(name: str) -> None:
    assert wall_clock_bounds(ALLOWED[name]) == []


def test_the_bound_check_names_file_and_line() -> None:
    (found,) = wall_clock_bounds(CAUGHT["elapsed"], "tests/unit/test_x.py")
    assert str(found) == "tests/unit/test_x.py:6: wall-clock bound of 2 s: `elapsed < 2`"


def test_the_importorskip_check() -> None:
    declared = {"matplotlib", "nvidia-ml-py", "pyyaml"}
    source = ("import pytest\npytest.importorskip('matplotlib')\npytest.importorskip('matplotlib.pyplot')\n"
              "pytest.importorskip('yaml')\npytest.importorskip('not_declared_here')\n")
    found = declared_importorskips(source, declared)
    assert [f.line for f in found] == [2, 3, 4]
    assert "(matplotlib)" in found[0].what and "(pyyaml)" in found[2].what  # yaml is PyYAML's module


def test_the_port_and_ci_checks() -> None:
    source = ("import os, socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.bind(('127.0.0.1', port))\n"
              "a = os.environ.get('CI') == 'true'\nb = os.environ['CI']\nc = os.getenv('CI')\nd = 'CI' in os.environ\n"
              "e = os.environ.get('CIRCLE')\n")
    assert [f.line for f in port_pickers(source)] == [3]
    assert [f.line for f in ci_readers(source)] == [5, 6, 7, 8]
