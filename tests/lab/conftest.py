from __future__ import annotations

import contextlib
import fcntl
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpunode_lab as lab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import CiValueError, under_ci  # noqa: E402 - tests/ put on the path just above


# The fleet's tests (test_fleet.py) run on the fleet's own sites beside the one-host tests
# (tests/conftest.py). Where one of them takes a site's part down on purpose (its fakepve), it holds
# this lock; a reading of the whole lab (its status, a second `lab up`) takes it too, so that it
# never sees, or mends, a fault another test made.
FLEET_SITES_LOCK = lab.LAB_DIR / "fleet" / "tests-faults.lock"


@contextlib.contextmanager
def _whole_fleet_sites() -> Iterator[None]:
    FLEET_SITES_LOCK.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(FLEET_SITES_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture(scope="session")
def fleet_sites_whole() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """A context manager: within it, no test has a fleet site's part down on purpose (see FLEET_SITES_LOCK)."""
    return _whole_fleet_sites


@pytest.fixture(scope="session")
def lab_status() -> dict[str, object]:
    """The lab's status; skips (or, under CI, fails) when the lab is not up."""
    try:
        ci = under_ci()
    except CiValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    with _whole_fleet_sites():
        st = lab.status()
    if not st.get("up"):
        if ci:
            pytest.fail(f"lab is not up under CI: .ci/run must run `gpunode lab up`; status: {json.dumps(st, default=str)}")
        pytest.skip("lab is not up: run `gpunode lab up` (needs root)")
    return st


@pytest.fixture(autouse=True)
def _needs_lab(lab_status: dict[str, object]) -> None:
    """Every test under tests/lab needs the lab."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Keep each phase's report on the item, so that a fixture can tell whether its test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)
