"""Mutated host files, and the one check every one of them must pass (tests/unit/test_hostfile_fuzz.py
and benchmarks/fuzz_hostfile.py share both).

A case is a shipped host file (the example, the lab's, the lab fleet's) with one change at one node:
its value replaced by a YAML fragment (a wrong type, a tag, a YAML 1.1 form, an odd or huge value,
a structure where a scalar is meant), its key renamed, the node removed, a key added; or one change
to the whole file (a directive, a second document, a cut, CRLF line ends). The file is written as
YAML text, so the fragment reaches gpunode's reader as a user would have typed it.

The check (``check``): ``validate`` and ``plan --json`` run in-process (CliRunner on gpunode.cli.app),
and ``validate`` exits 0 or 2 without a traceback, every line of its error output is one
``error: <file>: ...`` line that prints no control character and is cut short, its CPU time with
plan's stays under CPU_BOUND_S, nothing connects anywhere, and wherever validate passed, plan
exits 0 with strict JSON.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.ground.yamlsource import load_yaml, plain_value

ROOT = Path(__file__).resolve().parents[2]
BASES = [ROOT / "inventory" / "example" / "host.yml", ROOT / "inventory" / "lab" / "host.yml",
         ROOT / "inventory" / "lab" / "fleet.yml"]
CPU_BOUND_S = 2.0  # validate + plan of one case, time.process_time()
MAX_LINE = 1200  # an error line echoes values cut to ~80 characters: far below this
SENTINEL = "FUZZ_SENTINEL_VALUE"
KEY_SENTINEL = "FUZZ_SENTINEL_KEY"

# Values as YAML fragments, written where a value goes ("key: <fragment>", "- <fragment>").
WRONG_TYPES = ["true", "false", "null", "~", "", "0", "-1", "1.5", "-0.0", "'text'", "''", "[]", "{}", "[1, 2]",
               "{a: 1}", "{env: X}", "[{a: [1, {b: 2}]}]", "'8'", "8.0", "\"true\""]
YAML11 = ["0200", "-0200", "8:20", "190:20:30", "yes", "no", "on", "off", "Y", "n", "2024-01-01",
          "2001-12-14t21:59:43.10-05:00", "1_000", "0b101", "+0x1F", "0x1F", "0o777", "0x7FFFFFFFFFFFFFFF",
          ".Inf", "-.inf", ".NaN", "1e400", "1e3", "+12", "=", "<<"]
TAGS = ["!!python/object:os.system x", "!!python/object/apply:os.system ['true']", "!!python/name:os.system ''",
        "!foo 200", "!!int abc", "!!int 200", "!!str 200", "!!float 1", "!!bool yes", "!!binary aGk=", "! x",
        "!!map {a: 1}", "!!seq [1]", "!!set {a: null}", "!!omap [{a: 1}]", "!!timestamp 2024-01-01", "!!null ''",
        "!<tag:yaml.org,2002:str> x", "!e!x 1", "&anchor !!str x"]
ODD = ["-x", "--x", "'-rf /'", "{x}", "'{x}'", "\"{0}{1}\"", "'[/x]'", "[/x]", "\"[red]x[/red]\"", "'[bold'",
       "\"\\e[31mred\\e[0m\"", "\"\\x1b]0;title\\x07\"", "\"line1\\nline2\"", "\"a\\u202eb\"", "\"\\u0085x\"",
       "\"\\u2028\"", "\"\\t\"", "\"\\0\"", "\"\\r\\nerror: forged\"", "'%s%n'", "'$(id)'", "'`id`'",
       "\"' OR 1=1\"", "../../etc/passwd", "~/x", "/dev/zero", "'C:\\x'", "'\\\\'", "\"\\\\x1b\"", "*undefined",
       "'é漢字'", "\"\\U0001F600\"", "\"\\ud800\"", "'  spaced  '", "'#not-a-comment'", "'a: b'", "x #comment",
       "|\n  block\n  text", ">-\n  folded"]


def huge() -> list[str]:
    """Huge values, made once (the fragments are large)."""
    return ["9" * 100_001, "-" + "1" * 5000, "1" * 21, "1" * 20, "9" * 19, "0x" + "f" * 40, "0o" + "7" * 30,
            "1" + "0" * 400 + ".5", "'" + "x" * 200_000 + "'", "y" * 100_000, "\"" + "\\n" * 20_000 + "\"",
            "[" * 80 + "]" * 80, "[" + ", ".join(["1"] * 5000) + "]", "{" + ", ".join(f"k{i}: {i}" for i in range(3000)) + "}"]


KEYS = ["on", "yes", "true", "null", "1", "0200", "'1'", "\"\\e[31mkey\"", "\"key\\nforged\"", "'[/x]'", "[/x]",
        "'{x}'", "--tp-size", "-x", "'a.b'", "\"" + "k" * 5000 + "\"", "'<<'", "!!str tagged", "'é'", "\"\\t\""]
FILE_WIDE = ["%TAG !e! tag:example.com,2000:\n---\n", "%YAML 1.1\n---\n", "%YAML 1.2\n---\n", "%FOO bar\n---\n",
             "--- !!map\n", "\ufeff"]


def catalogue() -> list[str]:
    return WRONG_TYPES + YAML11 + TAGS + ODD + huge()


PathKey = tuple[str | int, ...]


def nodes(data: Any, path: PathKey = ()) -> Iterator[PathKey]:
    """Every node below the top, depth first."""
    children = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in children:
        yield path + (key,)
        yield from nodes(value, path + (key,))


def base_data(base: Path) -> Any:
    return load_yaml(base).data


class _Dumper(yaml.SafeDumper):
    """PyYAML's dumper writes by YAML 1.1: a string that 1.2 would read as something else (1e3,
    0o17) is quoted, so that the unchanged parts read back as they were."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    try:
        same = plain_value(value) == value
    except ValueError:
        same = False
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=None if same else '"')


_Dumper.add_representer(str, _represent_str)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30)


def value_at(data: Any, path: PathKey) -> Any:
    for part in path:
        data = data[part]
    return data


def _parent(data: Any, path: PathKey) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def _copy(data: Any) -> Any:
    return json.loads(json.dumps(data))


def with_value(data: Any, path: PathKey, fragment: str) -> str:
    """The file with the node at ``path`` written as ``fragment``."""
    copy = _copy(data)
    _parent(copy, path)[path[-1]] = SENTINEL
    text = dump(copy)
    assert text.count(SENTINEL) == 1
    if "\n" in fragment:  # a block scalar: indent its lines under the key's
        line = next(line for line in text.splitlines() if SENTINEL in line)
        indent = " " * (len(line) - len(line.lstrip(" -")) + 2)
        fragment = fragment.replace("\n", "\n" + indent)
    return text.replace(SENTINEL, fragment)


def with_key(data: Any, path: PathKey, key: str) -> str | None:
    """The file with the key at ``path`` renamed to ``key`` (a fragment); None for a list item."""
    if not isinstance(path[-1], str):
        return None
    copy = _copy(data)
    parent = _parent(copy, path)
    renamed = {(KEY_SENTINEL if name == path[-1] else name): value for name, value in parent.items()}
    parent.clear()
    parent.update(renamed)
    return dump(copy).replace(KEY_SENTINEL, key, 1)


def without(data: Any, path: PathKey) -> str:
    copy = _copy(data)
    del _parent(copy, path)[path[-1]]
    return dump(copy)


def with_extra_key(data: Any, path: PathKey, key: str, fragment: str) -> str | None:
    """The file with ``key: fragment`` added to the mapping at ``path``; None if not a mapping."""
    copy = _copy(data)
    target = _parent(copy, path)[path[-1]]
    if not isinstance(target, dict):
        return None
    target[KEY_SENTINEL] = SENTINEL
    return dump(copy).replace(KEY_SENTINEL, key, 1).replace(SENTINEL, fragment, 1)


def file_wide(text: str, kind: int, rng: random.Random) -> str:
    """One change to the whole file."""
    if kind < len(FILE_WIDE):
        return FILE_WIDE[kind] + text
    kind -= len(FILE_WIDE)
    if kind == 0:
        return text + "---\nversion: 1\n"
    if kind == 1:
        return text[:rng.randrange(len(text))]
    if kind == 2:
        return text.replace("\n", "\r\n")
    if kind == 3:
        return text + "\n" + "x" * rng.randrange(1, 50) + ": [\n"
    return "".join(text.splitlines(keepends=True)[::-1])


FILE_WIDE_KINDS = len(FILE_WIDE) + 5


@dataclass
class Case:
    """One mutated file: where it came from and what was done, to name a failure."""

    base: str
    what: str
    text: str


def mutated(rng: random.Random, values: list[str], extra_values: Callable[[random.Random], str] | None = None
            ) -> Case:
    """One case chosen by ``rng``: a base file, a node, a change (``extra_values`` draws a fragment
    of its own, e.g. from hypothesis, for some of the value changes)."""
    base = rng.choice(BASES)
    data = base_data(base)
    paths = list(nodes(data))
    path = rng.choice(paths)
    roll = rng.random()
    name = f"{base.relative_to(ROOT)}"
    if roll < 0.55 or (roll < 0.65 and extra_values is None):
        fragment = rng.choice(values)
        return Case(name, f"value at {path!r} := {fragment[:60]!r}", with_value(data, path, fragment))
    if roll < 0.65 and extra_values is not None:
        fragment = extra_values(rng)
        return Case(name, f"value at {path!r} := drawn {fragment[:60]!r}", with_value(data, path, fragment))
    if roll < 0.75:
        key = rng.choice(KEYS)
        text = with_key(data, path, key)
        if text is not None:
            return Case(name, f"key at {path!r} renamed {key[:60]!r}", text)
    if roll < 0.83:
        return Case(name, f"removed {path!r}", without(data, path))
    if roll < 0.92:
        key, fragment = rng.choice(KEYS + ["extra"]), rng.choice(values)
        text = with_extra_key(data, path, key, fragment)
        if text is not None:
            return Case(name, f"added {key[:40]!r}: {fragment[:40]!r} at {path!r}", text)
    kind = rng.randrange(FILE_WIDE_KINDS)
    return Case(name, f"file-wide change {kind}", file_wide(dump(data), kind, rng))


def every_node(values: list[str]) -> Iterator[Case]:
    """Each node of each base file once, its value replaced by the next fragment in turn; then
    each key renamed, in turn, to each odd key (the sweep that makes sure no node is missed)."""
    turn = 0
    for base in BASES:
        data = base_data(base)
        for path in nodes(data):
            fragment = values[turn % len(values)]
            turn += 1
            yield Case(str(base.relative_to(ROOT)), f"value at {path!r} := {fragment[:60]!r}",
                       with_value(data, path, fragment))
            if isinstance(path[-1], str) and turn % 4 == 0:
                key = KEYS[turn // 4 % len(KEYS)]
                text = with_key(data, path, key)
                assert text is not None
                yield Case(str(base.relative_to(ROOT)), f"key at {path!r} renamed {key[:60]!r}", text)


@dataclass
class Outcome:
    validate_exit: int
    plan_exit: int | None
    cpu_s: float
    problems: list[str] = field(default_factory=list)  # what is wrong with gpunode's handling of it


@contextmanager
def no_network() -> Iterator[list[str]]:
    """Every attempt to connect or resolve a name is refused and noted: plan needs neither."""
    tried: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        tried.append(repr(args[1:] if args and isinstance(args[0], socket.socket) else args)[:200])
        raise OSError("gpunode's fuzz test: no network")

    with mock.patch.object(socket.socket, "connect", refuse), mock.patch.object(socket, "getaddrinfo", refuse), \
            mock.patch.object(socket, "create_connection", refuse):
        yield tried


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check(case: Case, path: Path, runner: CliRunner) -> Outcome:
    """Write ``case`` to ``path``, run validate and plan --json on it, and say what went wrong."""
    path.write_text(case.text, encoding="utf-8", errors="surrogatepass")
    problems: list[str] = []
    with no_network() as tried:
        start = time.process_time()
        validate = runner.invoke(app, ["validate", str(path)])
        plan = runner.invoke(app, ["plan", str(path), "--json"]) if validate.exit_code == 0 else None
        cpu = time.process_time() - start
    for name, result in (("validate", validate), ("plan", plan)):
        if result is None:
            continue
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(f"{name} raised {type(result.exception).__name__}: {str(result.exception)[:300]}")
        if "Traceback" in result.stdout + result.stderr:
            problems.append(f"{name} printed a traceback")
    if validate.exit_code not in (0, 2):
        problems.append(f"validate exited {validate.exit_code}, not 0 or 2")
    lines = validate.stderr.splitlines()
    if validate.exit_code == 2:
        if not lines:
            problems.append("validate exited 2 and said nothing")
        if validate.stdout:
            problems.append(f"validate exited 2 with output: {validate.stdout[:200]!r}")
    for line in lines:
        if not line.startswith(f"error: {path}: "):
            problems.append(f"an error line that does not start 'error: {path}: ': {line[:300]!r}")
        if len(line) > MAX_LINE:
            problems.append(f"an error line of {len(line)} characters: {line[:200]!r}...")
        if not line.isprintable():
            problems.append(f"an error line with a character that does not print: {line[:300]!r}")
    if validate.stderr and not validate.stderr.endswith("\n"):
        problems.append("the error output does not end its last line")
    if cpu >= CPU_BOUND_S:
        problems.append(f"validate + plan took {cpu:.2f} s of CPU (bound {CPU_BOUND_S} s)")
    if tried:
        problems.append(f"tried the network: {tried[:3]}")
    if plan is not None:
        if plan.exit_code != 0:
            problems.append(f"validate passed but plan --json exited {plan.exit_code}: {plan.stderr[:400]!r}")
        else:
            try:
                _strict_json(plan.stdout)
            except ValueError as exc:
                problems.append(f"plan --json printed no strict JSON: {exc}")
    return Outcome(validate.exit_code, None if plan is None else plan.exit_code, cpu, problems)


def describe(case: Case, outcome: Outcome) -> str:
    return f"{case.base}: {case.what}: " + "; ".join(outcome.problems)
