"""Provision runs Ansible with the collection's strategy, gpunode.core.mitogen_linear
(gpunode.runner.strategy_env), unless the operator's environment names a strategy itself. Shown on
real plays: Mitogen's one Python per machine runs every module, so two tasks' commands have the same
parent; a GPU-side stage's play finds that stage's code already imported in the worker of its task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpunode.ground.paths import ANSIBLE_CFG, COLLECTIONS_PATH
from gpunode.runner import STRATEGY, strategy_env

PARENTS_PLAY = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.command: sh -c 'echo $PPID'
      register: first
      changed_when: false
    - ansible.builtin.command: sh -c 'echo $PPID'
      register: second
      changed_when: false
    - ansible.builtin.debug:
        msg: "answer {{ [first.stdout, second.stdout] | to_json }}"
"""
# A lookup runs in the worker Ansible forks for a task: it says whether modules are imported there.
IMPORTED_LOOKUP = """\
import sys
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [name in sys.modules for name in terms]
"""
STAGE_PLAY = """\
- hosts: localhost
  gather_facts: false
  tags: [%s]
  tasks:
    - ansible.builtin.debug:
        msg: "answer {{ lookup('imported', 'gpunode.stages.serve.command', 'docker', wantlist=True) | to_json }}"
"""


def answer(tmp_path: Path, play: str, environ: dict[str, str]) -> list:
    """Run ``play`` on localhost as gpunode's runner would with the operator's ``environ``; what its
    debug task said after "answer"."""
    (tmp_path / "lookup").mkdir(exist_ok=True)
    (tmp_path / "lookup" / "imported.py").write_text(IMPORTED_LOOKUP)
    (tmp_path / "play.yml").write_text(play)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_STRATEGY")},
           "ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS_PATH),
           "ANSIBLE_LOOKUP_PLUGINS": str(tmp_path / "lookup"), **environ, **strategy_env(environ),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "play.yml"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if '"msg": "answer ' in line)
    return json.loads(line.split('"msg": "answer ', 1)[1].rstrip('"').replace('\\"', '"'))


def test_mitogen_runs_every_module_of_a_machine_in_one_python(tmp_path: Path) -> None:
    first, second = answer(tmp_path, PARENTS_PLAY, {})
    assert first == second, "each task started a Python of its own: Mitogen's strategy is not in use"


def test_the_operators_own_strategy_is_kept(tmp_path: Path) -> None:
    # Ansible's own linear strategy: a new AnsiballZ interpreter per module run.
    first, second = answer(tmp_path, PARENTS_PLAY, {"ANSIBLE_STRATEGY": "linear"})
    assert first != second


def test_the_strategy_is_chosen_only_where_the_environment_chose_none() -> None:
    assert strategy_env({}) == {"ANSIBLE_STRATEGY": STRATEGY}
    assert strategy_env({"ANSIBLE_STRATEGY": ""}) == {"ANSIBLE_STRATEGY": STRATEGY}
    assert strategy_env({"ANSIBLE_STRATEGY": "free"}) == {}


@pytest.mark.parametrize(("tag", "environ", "imported"), [
    ("serve", {}, [True, True]),
    ("node", {}, [False, False]),  # not a GPU-side stage's play: nothing imported early
    ("serve", {"ANSIBLE_STRATEGY": "linear"}, [False, False]),
])
def test_a_stage_plays_code_is_imported_once_in_ansibles_process(tmp_path: Path, tag: str, environ: dict[str, str],
                                                                 imported: list[bool]) -> None:
    """The play tagged serve imports the serve stage's code (and the Docker SDK) as it starts: the
    worker of its task finds them imported."""
    assert answer(tmp_path, STAGE_PLAY % tag, environ) == imported


def test_preload_takes_only_the_stages_the_run_selects_and_never_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(COLLECTIONS_PATH))
    from ansible_collections.gpunode.core.plugins.strategy import mitogen_linear
    from gpunode.stages import common

    asked: list[str] = []

    def preload(stage: str) -> None:
        asked.append(stage)
        if stage == "smoke":
            raise OSError("no source here")

    monkeypatch.setattr(common, "preload", preload)
    assert mitogen_linear.preload_stages(["serve"], {"host", "container"}) == []
    assert mitogen_linear.preload_stages(["serve"], {"all"}, {"serve"}) == []
    assert mitogen_linear.preload_stages(["serve", "always"], {"host", "serve"}) == ["serve"]
    assert mitogen_linear.preload_stages(["smoke"]) == [] and asked == ["serve", "smoke"]


def test_mitogens_debug_switches_never_reach_a_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Mitogen's debug log carries modules' arguments: its switches are kept out of the run's
    environment (ansible-runner passes the whole of it on), said, and given back afterwards."""
    import ansible_runner
    from rich.console import Console

    from gpunode import hostfile, runner

    seen: dict[str, str | None] = {}

    class Done:
        status, rc, stats = "successful", 0, {}

    def run(**kwargs: object) -> Done:
        seen.update({name: os.environ.get(name) for name in runner.MITOGEN_DEBUG_ENV})
        seen["ANSIBLE_STRATEGY"] = kwargs["envvars"].get("ANSIBLE_STRATEGY")  # type: ignore[attr-defined]
        (Path(str(kwargs["private_data_dir"])) / "artifacts" / str(kwargs["ident"])).mkdir(parents=True)
        return Done()

    monkeypatch.setattr(ansible_runner, "run", run)
    monkeypatch.setenv("GPUNODE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MITOGEN_LOG_LEVEL", "debug")
    monkeypatch.setenv("MITOGEN_ROUTER_DEBUG", "1")
    lab = hostfile.load(Path(__file__).resolve().parents[2] / "inventory" / "lab" / "host.yml")
    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        summary = runner.provision(lab, ["host"], console=Console(file=stream, width=200), secrets={})
    assert summary.exit_code == 0
    assert all(seen[name] is None for name in runner.MITOGEN_DEBUG_ENV) and seen["ANSIBLE_STRATEGY"] == STRATEGY
    assert "not passing MITOGEN_LOG_LEVEL, MITOGEN_ROUTER_DEBUG to Ansible" in out.read_text()
    assert os.environ["MITOGEN_LOG_LEVEL"] == "debug"
