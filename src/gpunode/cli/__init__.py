"""The command line. Thin: provision and every stage-named verb run the collection's playbook
through one path (gpunode.cli.stagerun), ``--local`` runs a stage's code on this machine instead,
and the other verbs are modules of the package. Exit codes are gpunode.ground.exitcodes'.

One module per group of verbs, each registering on ``app`` (gpunode.cli.common) when imported:
inspect_ (validate, plan), provision (and the stage verbs), check, local (p2p, serve, smoke), image,
diagnose, bench, lab. Heavy modules (pydantic models, ansible-runner, docker) are imported inside the
commands.
"""

from __future__ import annotations

import sys

from gpunode.cli.common import AB_PRESETS_HELP, app
# The verb modules, in the order --help lists their verbs: importing one registers its commands.
from gpunode.cli import inspect_, provision, check, local, image, diagnose, bench, lab  # noqa: F401
from gpunode.ground.exitcodes import INTERRUPTED

__all__ = ["AB_PRESETS_HELP", "app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(INTERRUPTED) from None
