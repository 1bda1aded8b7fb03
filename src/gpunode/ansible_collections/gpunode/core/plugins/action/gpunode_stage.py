"""The action of gpunode.core.gpunode_stage (its documentation is the module's): the stage runs here, in
the controller's own Ansible process, with the gpunode package that gpunode.core's filters need too,
and its record is written on the task's host by ansible.builtin.copy's own action, in the same task.

Why not a module delegated to localhost: each stage then paid a new interpreter, AnsiballZ, Ansible's
module imports and a second task for the record (about 1.2 s a stage in a provision that changes
nothing: issue 36), for no isolation the controller does not already give its filters.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from ansible.plugins.action import ActionBase

STAGES = ["model", "image", "p2p", "serve", "smoke", "router", "monitor"]
ARGUMENT_SPEC: dict[str, Any] = {
    "stage": {"type": "str", "required": True, "choices": STAGES},
    "host": {"type": "dict", "required": True},
    "derived": {"type": "dict", "required": True},
    "api_key_file": {"type": "path"},
    "fabric": {"type": "dict"},
    "hub_token_file": {"type": "path"},
    "record": {"type": "str"},
}


def _plain(value: Any) -> Any:
    """Plain JSON types, as a module received them (Ansible's tagged strings and dicts are subclasses
    the host models' strict types need not know)."""
    return json.loads(json.dumps(value))


def run_stage(args: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """The stage's outcome as the task's result (without the record's write)."""
    from pydantic import ValidationError

    from gpunode.stages import common as stage
    from gpunode.stages.engine import EngineUnreachable

    name = args["stage"]
    try:
        target = stage.target_from_data(name, _plain(args["host"]), _plain(args["derived"]), args["api_key_file"],
                                        _plain(args["fabric"]), args["hub_token_file"])
    except ValidationError as exc:
        # Data gpunode's own inventory did not write (an edited inventory, another gpunode's): one line.
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return {"failed": True, "msg": f"{name}: the host data is not what this gpunode writes ({exc.title}): "
                                       f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}{more}"}
    except ValueError as exc:  # input the stage refuses (a fabric for the router)
        return {"failed": True, "msg": f"{name}: {exc}"}
    try:
        result = stage.run(name, target, check_mode)
    except EngineUnreachable as exc:
        return {"failed": True, "msg": str(exc)}
    outcome: dict[str, Any] = {"changed": result.changed, "gpunode_summary": "\n".join(result.summary),
                               "data": _plain(result.data)}
    if result.failed:
        # gpunode_unreachable: the machine (or the Hub) did not answer; gpunode reports exit 3.
        outcome.update(failed=True, msg=f"{name}: {result.failure()}", gpunode_unreachable=result.unreachable)
    return outcome


class ActionModule(ActionBase):
    TRANSFERS_FILES = True  # the record, through copy

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            outcome = run_stage(args, bool(self._task.check_mode))
        except Exception as exc:  # the point: no exception leaves the stage as a traceback
            return {**result, "failed": True, "msg": f"gpunode_stage: unexpected {type(exc).__name__}: {exc}",
                    "exception": traceback.format_exc()}
        result.update(outcome)
        record = (outcome.get("data") or {}).get("record")
        # Kept even when the stage failed, so that `gpunode check` can say what failed, later.
        if args["record"] and record is not None:
            written = self._write(args["record"], json.dumps(record, indent=4, sort_keys=True) + "\n", task_vars)
            if written.get("failed"):
                why = written.get("msg", "copy failed")
                result["failed"] = True
                result["msg"] = (f"{result['msg']}; " if result.get("msg") else "") + \
                    f"the stage's record {args['record']} could not be written: {why}"
            result["changed"] = bool(result.get("changed")) or bool(written.get("changed"))
            if written.get("diff"):
                result["diff"] = written["diff"]
        return result

    def _write(self, dest: str, content: str, task_vars: dict[str, Any] | None) -> dict[str, Any]:
        """``content`` at ``dest`` on the task's host by ansible.builtin.copy's action: its check mode, diff
        and idempotence (only a record that differs is sent)."""
        task = self._task.copy()
        task.args = {"content": content, "dest": dest, "mode": "0644"}
        copy = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.copy", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return dict(copy.run(task_vars=task_vars))
