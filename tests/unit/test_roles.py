"""Roles keep meta/argument_specs.yml equal to defaults/main.yml, and every variable is prefixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").exists())


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_equal_defaults(role: str) -> None:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, value in defaults.items():
        assert options[name]["default"] == value, name
        assert options[name].get("description"), name
        assert name.startswith(f"{role}_"), f"{name} is not prefixed with {role}_"


def test_there_are_roles() -> None:
    assert "gpu_node" in ROLES
