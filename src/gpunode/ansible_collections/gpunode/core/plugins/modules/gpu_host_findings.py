#!/usr/bin/python
"""Ansible module: turn gathered host facts into named findings with fixes (gpunode.host).

Runs on the controller with gpunode's interpreter. Fails, before the stage changes anything,
when a finding is blocking (something the stage cannot fix by itself).
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpu_host_findings
short_description: Evaluate a GPU host's facts into findings, failing on blocking ones
options:
  facts: {type: dict, required: true}
  driver_version: {type: str, required: true}
  open_module: {type: bool, default: true}
  disable_hmm: {type: bool, default: true}
  release_vfio: {type: bool, default: true}
  persistenced: {type: bool, default: true}
  installer: {type: bool, default: false}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "facts": {"type": "dict", "required": True},
            "driver_version": {"type": "str", "required": True},
            "open_module": {"type": "bool", "default": True},
            "disable_hmm": {"type": "bool", "default": True},
            "release_vfio": {"type": "bool", "default": True},
            "persistenced": {"type": "bool", "default": True},
            "installer": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    from gpunode.host.findings import Expectations, as_dicts, evaluate

    p = module.params
    expect = Expectations(p["driver_version"], p["open_module"], p["disable_hmm"], p["release_vfio"],
                          p["persistenced"], p["installer"])
    findings = evaluate(p["facts"], expect)
    summary = "\n".join(f.line() for f in findings)
    blocking = [f for f in findings if f.blocking]
    if blocking:
        module.fail_json(msg="host preflight: " + "; ".join(f.line() for f in blocking),
                         findings=as_dicts(findings), gpunode_summary=summary)
    module.exit_json(changed=False, findings=as_dicts(findings), gpunode_summary=summary,
                     failed_findings=[f.name for f in findings if f.status == "fail"])


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
