"""Shared by gpunode.core's modules: a module's failure is a message through fail_json, never a
traceback."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any


def run(module: Any, name: str, body: Callable[[Any], None]) -> None:
    """Call body(module); anything it raises becomes fail_json (the traceback only at -vvv)."""
    try:
        body(module)
    except Exception as exc:  # the point: no exception leaves a module as a traceback
        module.fail_json(msg=f"{name}: unexpected {type(exc).__name__}: {exc}", exception=traceback.format_exc())
