from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import gpunode_lab as lab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import CiValueError, under_ci  # noqa: E402 - tests/ put on the path just above


@pytest.fixture(scope="session")
def lab_status() -> dict[str, object]:
    """The lab's status; skips (or, under CI, fails) when the lab is not up."""
    try:
        ci = under_ci()
    except CiValueError as exc:
        pytest.fail(str(exc), pytrace=False)
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
