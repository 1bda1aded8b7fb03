"""The host file, fuzzed (issue #31): the example, lab and fleet host files mutated at every node
(wrong types, tags, YAML 1.1 forms, odd, huge and nested values, renamed and added keys, whole-file
changes) and each one run through ``validate`` and ``plan --json`` in-process. Every case exits 0
or 2 with no traceback, one printable line per error, bounded CPU time, no network, and a plan
wherever validate passed (tests/fakes/hostfile_fuzz.py says exactly what is checked).

Fixed seed (derandomize), about a minute in all; benchmarks/fuzz_hostfile.py runs the same
mutations for thousands of cases.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes import hostfile_fuzz as fuzz  # noqa: E402 - tests/ put on the path just above

# Rich would colour the "error:" prefix on a terminal it was told to assume.
RUNNER_ENV = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None, "COLUMNS": "200"}
EXAMPLES = 250  # drawn cases; with the sweep below about a minute on one core
VALUES = fuzz.catalogue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env=RUNNER_ENV)


@pytest.mark.parametrize("base", fuzz.BASES, ids=lambda base: str(base.relative_to(fuzz.ROOT)))
def test_the_unchanged_files_pass_as_the_cases_write_them(base: Path, folder: Path, runner: CliRunner) -> None:
    """The cases are written by PyYAML's dumper: unchanged, the file must still validate and plan,
    so that a refusal in a case is the mutation's."""
    case = fuzz.Case(str(base), "unchanged", fuzz.dump(fuzz.base_data(base)))
    outcome = fuzz.check(case, folder / "host.yml", runner)
    assert outcome.validate_exit == 0 and outcome.plan_exit == 0, fuzz.describe(case, outcome)
    assert outcome.problems == [], fuzz.describe(case, outcome)


def test_every_node_of_every_file(folder: Path, runner: CliRunner) -> None:
    """Each node once, with the catalogue's fragments in turn (and a key renamed every fourth)."""
    failures = []
    cases = 0
    for case in fuzz.every_node(VALUES):
        cases += 1
        outcome = fuzz.check(case, folder / "host.yml", runner)
        if outcome.problems:
            failures.append(fuzz.describe(case, outcome))
    assert cases > 250  # the three files have about 300 nodes
    assert failures == [], f"{len(failures)} of {cases} cases failed:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("fragment", ["'" + "x" * 200_000 + "'", "y" * 100_000], ids=["quoted-200k", "plain-100k"])
def test_a_long_value_at_every_leaf(fragment: str, folder: Path, runner: CliRunner) -> None:
    """A long string wherever the lab host file has a scalar: every check that reads a value
    (a pattern, a regex search, an echo) stays linear and cut."""
    data = fuzz.base_data(fuzz.BASES[1])
    failures = []
    leaves = [path for path in fuzz.nodes(data) if not isinstance(fuzz.value_at(data, path), (dict, list))]
    for path in leaves:
        case = fuzz.Case("inventory/lab/host.yml", f"value at {path!r} := {fragment[:20]!r}...",
                         fuzz.with_value(data, path, fragment))
        outcome = fuzz.check(case, folder / "long.yml", runner)
        if outcome.problems:
            failures.append(fuzz.describe(case, outcome)[:600])
    assert len(leaves) > 30
    assert failures == [], f"{len(failures)} of {len(leaves)} cases failed:\n" + "\n".join(failures)


def _json_value() -> st.SearchStrategy[object]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


@st.composite
def fragments(draw: st.DrawFn) -> str:
    """A value drawn by hypothesis, written as YAML: text of any characters (JSON's quoting is
    YAML's), numbers of any size, floats, nested structures (JSON is YAML's flow style)."""
    kind = draw(st.sampled_from(["text", "plain", "int", "float", "nested"]))
    if kind == "text":
        return json.dumps(draw(st.text(max_size=200)))
    if kind == "plain":
        return draw(st.from_regex(r"[A-Za-z0-9_./:~+-]{1,40}", fullmatch=True))
    if kind == "int":
        return str(draw(st.integers(min_value=-(10 ** 30), max_value=10 ** 30)))
    if kind == "float":
        return repr(draw(st.floats()))
    return json.dumps(draw(_json_value()))


@settings(derandomize=True, database=None, max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(rng=st.randoms(use_true_random=False), drawn=st.lists(fragments(), min_size=1, max_size=1))
def test_drawn_mutations(rng: random.Random, drawn: list[str], folder: Path, runner: CliRunner) -> None:
    case = fuzz.mutated(rng, VALUES, lambda _: drawn[0])
    outcome = fuzz.check(case, folder / "drawn.yml", runner)
    assert outcome.problems == [], fuzz.describe(case, outcome)
