from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPUNODE = [sys.executable, "-m", "gpunode"]


def _runner(state: Path):
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "GPUNODE_STATE_DIR": str(state), "COLUMNS": "200", **(env or {})}
        return subprocess.run([*GPUNODE, *args], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT)

    return run


@pytest.fixture
def gpunode(tmp_path: Path):
    """Run the real CLI in a subprocess with a private state dir; returns CompletedProcess."""
    return _runner(tmp_path / "state")


@pytest.fixture(scope="module")
def gpunode_module(tmp_path_factory: pytest.TempPathFactory):
    """The same, for module-scoped fixtures."""
    return _runner(tmp_path_factory.mktemp("state"))


# CI runs the suite on three workers (pytest-xdist; pyproject.toml's addopts): the one-host lab
# tests share the first lab site and run one after another on one worker, the fleet's tests
# (test_fleet.py) on the fleet's own two sites on another, beside them; the real-engine tests
# (images and Docker) share their session-built images on the third; each unit test goes where
# there is room. The lab's tests mostly wait on SSH, Ansible and the servers, the image builds on
# PyPI and the disk, so the three overlap on two cores instead of adding up. (xdist's own
# loadgroup cannot be used: its group suffix is lost on pytest 9's node ids.)
XDIST_GROUPS = {"lab": "lab", "image": "engine", "docker": "engine"}
XDIST_FILE_GROUPS = {"lab/test_fleet.py": "fleet"}


def xdist_group(nodeid: str) -> str:
    """The group a test runs in (its own node id: a group of one)."""
    parts = nodeid.split("::", 1)[0].split("/", 2)
    if len(parts) != 3 or parts[0] != "tests":
        return nodeid
    return XDIST_FILE_GROUPS.get(f"{parts[1]}/{parts[2]}") or XDIST_GROUPS.get(parts[1], nodeid)


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) the hook is unknown: not an error
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ByGroup(config, log)


# ----------------------------------------------------------------------------- every case asserts
# A case that ran no assertion proves nothing, so it fails. Counted: each assert that passed in a
# rewritten module (test modules, conftests and the helpers registered below; pytest calls
# pytest_assertion_pass for each, with enable_assertion_pass_hook in pyproject.toml), each
# pytest.raises / pytest.warns entered (a case that expects a refusal asserts that way), and each
# assertion a case counts itself through the ``asserted`` fixture (a helper outside tests/ that
# raises AssertionError). A skipped case is not a pass and needs none.
pytest.register_assert_rewrite("fakes")
_ASSERTIONS = [0]


def _counting(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _ASSERTIONS[0] += 1
        return original(*args, **kwargs)
    return counted


pytest.raises = _counting(pytest.raises)  # type: ignore[assignment]
pytest.warns = _counting(pytest.warns)  # type: ignore[assignment]


def pytest_assertion_pass(item: pytest.Item, lineno: int, orig: str, expl: str) -> None:
    _ASSERTIONS[0] += 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    _ASSERTIONS[0] = 0
    result = yield
    if _ASSERTIONS[0] == 0:
        pytest.fail(f"{item.nodeid} ran no assertion: a case that asserts nothing proves nothing", pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    passed = terminalreporter.stats.get("passed", [])
    integrity = [r for r in passed if "recording" in getattr(r, "keywords", {})]
    if integrity:
        terminalreporter.write_line(f"of the {len(passed)} passed, {len(integrity)} are fixture-integrity checks "
                                    "(marked recording: they read a recording and no gpunode code)")
