"""The suite's own rule, tried on a small suite of its own: a case that ran no assertion fails
(tests/conftest.py counts passed asserts, pytest.raises and pytest.warns), on every parametrized
case; a skipped case says why and needs none."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
CASES = '''
import pytest

def helper(value):
    assert value  # an assert in a helper of the test module counts


def test_asserts_nothing():
    value = 1


def test_asserts():
    assert 1


def test_asserts_through_a_helper():
    helper(1)


def test_expects_a_refusal():
    with pytest.raises(ValueError):
        int("x")


@pytest.mark.parametrize("value", [0, 1])
def test_asserts_on_one_case_only(value):
    if value:
        assert value


def test_skips():
    pytest.skip("a skip says why")
'''


def test_a_case_that_ran_no_assertion_fails(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nenable_assertion_pass_hook = true\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", "test_cases.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    outcomes = {line.split(" ", 2)[1].split("::")[1]: line.split(" ", 1)[0]
                for line in run.stdout.splitlines() if line.startswith(("PASSED ", "FAILED ", "SKIPPED "))
                and "::" in line}
    assert outcomes == {"test_asserts_nothing": "FAILED", "test_asserts": "PASSED",
                        "test_asserts_through_a_helper": "PASSED", "test_expects_a_refusal": "PASSED",
                        "test_asserts_on_one_case_only[0]": "FAILED", "test_asserts_on_one_case_only[1]": "PASSED"
                        }, run.stdout
    assert "2 failed, 4 passed, 1 skipped" in run.stdout
    assert "test_asserts_nothing ran no assertion" in run.stdout and run.returncode == 1
