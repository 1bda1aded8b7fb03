"""gpunode provision's strategy: Mitogen's linear one, which gpunode adds to by importing a GPU-side
stage's code once, in Ansible's own process, when that stage's play starts."""

from __future__ import annotations

DOCUMENTATION = r"""
name: mitogen_linear
short_description: Mitogen's linear strategy, with a GPU-side stage's code imported once per play
description:
  - Runs tasks as Ansible's own C(linear) strategy does (in lockstep per host batch, C(serial) and
    C(max_fail_percentage) as usual), through Mitogen (the C(mitogen) package's C(mitogen_linear)), where each
    machine keeps one Python that runs every module in memory, instead of a new interpreter unpacking and
    compiling an AnsiballZ payload for each module run.
  - As the play of a GPU-side stage the run selects starts (a play tagged C(model), C(image), C(p2p), C(serve),
    C(smoke), C(router) or C(monitor)), the stage's code from the gpunode package is imported in this process, so the
    processes Ansible forks for the play's tasks (the M(gpunode.core.gpunode_stage) action runs in them)
    inherit it instead of each importing it again.
  - Unlike Mitogen's own, it pins no process to a CPU.
  - C(gpunode provision) selects it (C(ANSIBLE_STRATEGY)) unless the environment names a strategy itself.
notes:
  - Mitogen cannot start a module again in another interpreter (C(respawn_module)); the roles install
    C(python3-apt) before their first C(ansible.builtin.apt) task for that reason.
requirements:
  - mitogen (the Python package, at gpunode's pin)
  - gpunode (the Python package), for the stages' code; without it the stages are not imported early
author:
  - gpunode developers (!UNKNOWN)
"""

from typing import Any

from ansible import context
from ansible.errors import AnsibleError
from ansible.utils.display import Display

try:
    import ansible_mitogen.affinity
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule as MitogenLinear
except ImportError as exc:  # the collection loads where Mitogen is missing; this strategy then says so when chosen
    MITOGEN_ERROR: ImportError | None = exc

    class MitogenLinear:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise AnsibleError(f"gpunode.core.mitogen_linear needs the mitogen package: {MITOGEN_ERROR}")
else:
    MITOGEN_ERROR = None
    # Mitogen pins Ansible's processes to one CPU each (all of them to one where there are fewer than
    # four), and what they start inherits it: the stages' SSH forwards and the image's stream through
    # them would share one core. Ansible's own strategy pins nothing; neither does this one.
    ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

display = Display()


def preload_stages(tags: list[str], selected: set[str] | frozenset[str] = frozenset({"all"}),
                   skipped: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Import the code of the GPU-side stages among a play's ``tags`` that the run selects
    (``--tags``, ``--skip-tags``); the stages imported. Only a speed-up: a stage whose code cannot be
    imported here is left to its task, which says why."""
    try:
        from gpunode.stages.common import GPU_STAGES, preload
    except ImportError:
        return []
    stages = [tag for tag in tags if tag in GPU_STAGES and ("all" in selected or tag in selected) and tag not in skipped]
    done = []
    for stage in stages:
        try:
            preload(stage)
        except Exception as exc:  # noqa: BLE001 - the stage's own task imports it again and reports
            display.vvv(f"gpunode.core.mitogen_linear: the {stage} stage's code was not imported early: {exc}")
        else:
            done.append(stage)
    return done


class StrategyModule(MitogenLinear):  # type: ignore[misc,valid-type]
    def run(self, iterator: Any, play_context: Any, result: int = 0) -> Any:
        preload_stages(list(iterator._play.tags or []), set(context.CLIARGS.get("tags") or ["all"]),
                       set(context.CLIARGS.get("skip_tags") or []))
        return super().run(iterator, play_context, result)
