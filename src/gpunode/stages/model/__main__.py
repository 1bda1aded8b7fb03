"""The model tools' command, run on the machine that holds the weights by the model stage and by
``gpunode check --layer model``:

    python -m gpunode.stages.model converge|verify < request.json

The request (on stdin, so that the Hub token is never an argument or in the environment) is
``{"plan": <gpunode_derived.model>, "token": str|null, "check": bool, "level": "full"|"sizes"|null}``.
Every output line is one JSON object: ``{"progress": ...}`` while fetching, then ``{"result": ...}``
or ``{"error": ..., "kind": ...}``. Exit codes are gpunode's (gpunode.ground.exitcodes).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpunode.ground import exitcodes

MAX_REQUEST_BYTES = 1 << 20


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("converge", "verify"):
        _emit({"error": "usage: python -m gpunode.stages.model converge|verify < request.json", "kind": "usage"})
        return exitcodes.BAD_INPUT
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the stage's own progress line instead
    token = None
    try:
        request = json.loads(sys.stdin.read(MAX_REQUEST_BYTES))
        plan_data = request["plan"]
        token = request.get("token") or None
        from gpunode.stages.model.fetch import HubRefused, HubUnreachable, Plan, StoreTooSmall, converge, offline
        from gpunode.stages.model.manifest import ManifestError

        plan = Plan.of(plan_data)
    except (ValueError, KeyError, TypeError) as exc:
        _emit({"error": f"not a model request ({type(exc).__name__})", "kind": "usage"})
        return exitcodes.BAD_INPUT
    try:
        if argv[0] == "verify":
            result = offline(plan, plan_data["source"], request.get("level"))
        elif plan_data["source"] == "hub":
            result = converge(plan, token, bool(request.get("check")), _emit)
        else:
            result = offline(plan, plan_data["source"])
    except HubUnreachable as exc:
        _emit({"error": f"the Hub at {plan.endpoint} did not answer: {exc}", "kind": "unreachable"})
        return exitcodes.UNREACHABLE
    except HubRefused as exc:
        _emit({"error": str(exc), "kind": "refused"})
        return exitcodes.FAILED
    except StoreTooSmall as exc:
        _emit({"error": str(exc), "kind": "store_too_small"})
        return exitcodes.FAILED
    except ManifestError as exc:
        _emit({"error": f"the manifest {plan.manifest}: {exc}; remove it to list the revision again", "kind": "manifest"})
        return exitcodes.FAILED
    except OSError as exc:
        text = str(exc).replace(token, "***") if token else str(exc)
        _emit({"error": f"{type(exc).__name__}: {text}", "kind": "os"})
        return exitcodes.FAILED
    _emit({"result": result})
    return exitcodes.OK if result["verify"]["ok"] else exitcodes.FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
