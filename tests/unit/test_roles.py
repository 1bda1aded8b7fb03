"""Roles keep meta/argument_specs.yml equal to defaults/main.yml, and every variable is prefixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpunode.ground.paths import COLLECTION

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (COLLECTION / "roles").iterdir() if (p / "defaults" / "main.yml").exists())


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_equal_defaults(role: str) -> None:
    defaults = yaml.safe_load((COLLECTION / "roles" / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((COLLECTION / "roles" / role / "meta" / "argument_specs.yml").read_text())
    # One entry point (main), or several of shared tasks (common: stage, nvidia_installer).
    options = {name: option for entry in specs["argument_specs"].values() for name, option in entry["options"].items()}
    assert set(options) == set(defaults)
    for name, value in defaults.items():
        assert options[name]["default"] == value, name
        assert options[name].get("description"), name
        # An unquoted ", " in a flow mapping splits a description into a stray key: nothing but these.
        assert set(options[name]) <= {"type", "elements", "choices", "default", "description", "required"}, name
        assert name.startswith(f"{role}_"), f"{name} is not prefixed with {role}_"


def test_there_are_roles() -> None:
    """One role per stage, named as the stage (gpunode.ground.stagelist), and the tasks they share."""
    from gpunode.ground.stagelist import STAGE_NAMES

    assert ROLES == sorted([*STAGE_NAMES, "common"])


def _shell_tasks(node: object) -> list[dict]:
    """Every task (blocks and handlers included) that runs ansible.builtin.shell."""
    found: list[dict] = []
    if isinstance(node, list):
        for item in node:
            found += _shell_tasks(item)
    elif isinstance(node, dict):
        if "ansible.builtin.shell" in node or "shell" in node:
            found.append(node)
        for key in ("block", "rescue", "always"):
            found += _shell_tasks(node.get(key))
    return found


TASK_FILES = sorted((COLLECTION / "roles").glob("*/tasks/*.yml")) + sorted((COLLECTION / "roles").glob("*/handlers/*.yml"))



def _script(task: dict) -> str:
    return str(task.get("ansible.builtin.shell") or task.get("shell"))


def _needs_pipefail(task: dict) -> bool:
    return "|" in _script(task).replace("||", "") or len(_script(task).strip().splitlines()) > 1


def pipeline_problem(task: dict) -> str | None:
    """A shell script with a pipe or several lines must stop at the first failing part:
    `a | b` in sh reports only b's status, so a truncated stream would pass."""
    if not _needs_pipefail(task):
        return None
    if "set -euo pipefail" not in _script(task):
        return f"{task['name']!r} lacks set -euo pipefail"
    if (task.get("args") or {}).get("executable") != "/bin/bash":
        return f"{task['name']!r} sets pipefail but runs under sh (args.executable: /bin/bash)"
    return None


def test_shell_scripts_fail_when_any_part_fails() -> None:
    checked = [(path, task) for path in TASK_FILES for task in _shell_tasks(yaml.safe_load(path.read_text()))
               if _needs_pipefail(task)]
    assert len(checked) >= 2  # the probe image build and the boot-configuration handler
    problems = [f"{path.relative_to(COLLECTION)}: {pipeline_problem(task)}" for path, task in checked if pipeline_problem(task)]
    assert not problems, problems


def test_pipeline_rule_catches_a_bare_pipe() -> None:
    assert "lacks set -euo pipefail" in pipeline_problem({"name": "t", "shell": "tar -c . | docker import - x"})
    assert "runs under sh" in pipeline_problem({"name": "t", "shell": "set -euo pipefail\ntar -c . | docker import - x"})
    assert pipeline_problem({"name": "t", "shell": "modprobe -r a && modprobe a"}) is None
