"""The product reaches the lab only through gpunode.ground.labdoor's entry points: with the lab
installed they are the lab's own functions; without it, or with a lab that does not import, each
verb that needs it says how to install it in one line, and nothing else needs it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.ground import exitcodes, labdoor

ROOT = Path(__file__).resolve().parents[2]


def test_the_door_opens_on_the_lab_installed_here() -> None:
    import gpunode_lab.image

    assert labdoor.installed()
    assert labdoor.stand_in_tag() == gpunode_lab.image.fake_tag()


@pytest.mark.parametrize("found", [[], [EntryPoint("main", "gpunode_lab_gone.cli:main", labdoor.GROUP)]])
def test_without_a_working_lab_every_lab_verb_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                                    found: list[EntryPoint]) -> None:
    monkeypatch.setattr(labdoor, "entry_points", lambda group, name: [e for e in found if e.name == name])
    with pytest.raises(labdoor.LabMissing, match=r"pip install -e \. -e \./lab"):
        labdoor.stand_in_tag()
    result = CliRunner().invoke(app, ["lab", "up"])
    assert result.exit_code == exitcodes.ENVIRONMENT
    assert result.stderr.count("\n") == 1 and "the lab is" in result.stderr and "Traceback" not in result.stderr


def test_a_lab_host_file_without_the_lab_is_bad_input_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labdoor, "entry_points", lambda group, name: [])
    result = CliRunner().invoke(app, ["validate", str(ROOT / "inventory" / "lab" / "host.yml")])
    assert result.exit_code == exitcodes.BAD_INPUT
    assert "image.lab_stand_in: the lab is not installed here" in result.stderr
    assert CliRunner().invoke(app, ["validate", str(ROOT / "inventory" / "example" / "host.yml")]).exit_code == 0


@pytest.mark.parametrize(("argv", "said"), [(["lab", "bogus"], "No such command 'bogus'. (gpunode lab --help)"),
                                            (["lab", "up", "--bogus"], "No such option: --bogus (gpunode lab up --help)")])
def test_a_lab_usage_error_is_one_line(argv: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpunode", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr == f"error: {said}\n" and done.stdout == ""
