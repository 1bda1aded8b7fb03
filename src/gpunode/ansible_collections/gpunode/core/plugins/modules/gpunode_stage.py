#!/usr/bin/python
"""Ansible module: run one GPU-side stage (image, p2p, serve, smoke) through gpunode.stagerun.

Runs on the controller with gpunode's interpreter (delegate_to: localhost); reaches the node's
Docker engine over SSH. Thin: the stage logic is gpunode's own tested Python.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpunode_stage
short_description: Run a GPU-side provision stage on a node's Docker engine
options:
  stage: {type: str, required: true, choices: [image, p2p, serve, smoke]}
  hostfile: {type: path, required: true}
  host: {type: str, required: true, description: the host's name in the host file}
  api_key_file: {type: path, description: the run's file holding the server API key}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "stage": {"type": "str", "required": True, "choices": ["image", "p2p", "serve", "smoke"]},
            "hostfile": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "api_key_file": {"type": "path", "no_log": False},
        },
        supports_check_mode=True,
    )
    from gpunode import hostfile, stagerun
    from gpunode.engine import EngineUnreachable

    p = module.params
    try:
        hosts = {h.name: h for h in hostfile.load(Path(p["hostfile"])).hosts}
    except hostfile.HostFileError as exc:
        module.fail_json(msg=f"host file: {exc}")
    if p["host"] not in hosts:
        module.fail_json(msg=f"host file {p['hostfile']}: no host named {p['host']!r} "
                             f"(it has: {', '.join(hosts) or 'none'})")
    try:
        result = stagerun.run(p["stage"], hosts[p["host"]], p["api_key_file"], module.check_mode)
    except EngineUnreachable as exc:
        module.fail_json(msg=str(exc))
    summary = "\n".join(result.summary)
    if result.failed:
        module.fail_json(msg=f"{p['stage']}: " + (result.summary[0] if result.summary else "failed"),
                         gpunode_summary=summary, data=result.data)
    module.exit_json(changed=result.changed, gpunode_summary=summary, data=result.data)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a module's failure is a message, never a traceback (README, exit codes)
        import json
        import sys
        import traceback

        print(json.dumps({"failed": True, "msg": f"{Path(__file__).stem}: unexpected {type(exc).__name__}: {exc}",
                          "exception": traceback.format_exc()}))
        sys.exit(1)
