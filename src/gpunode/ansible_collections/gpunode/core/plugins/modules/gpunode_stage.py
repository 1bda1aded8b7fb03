#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: gpunode_stage
short_description: Run a GPU-side provision stage on a node's Docker engine
description:
  - Runs one of gpunode's GPU-side stages (image, p2p, serve, smoke) for one host of a host file, through the
    gpunode Python package, against the node's Docker engine over SSH.
  - Runs on the controller with gpunode's interpreter (delegated to localhost).
  - In check mode the stage reports what it would do and changes nothing.
version_added: 0.1.0
author:
  - gpunode developers (!UNKNOWN)
requirements:
  - the gpunode Python package on the controller
options:
  stage:
    description: The stage to run.
    type: str
    required: true
    choices: [image, p2p, serve, smoke]
  hostfile:
    description: The gpunode host file (YAML).
    type: path
    required: true
  host:
    description: The host's name in the host file.
    type: str
    required: true
  api_key_file:
    description: The run's file holding the server's API key, when the host file names one.
    type: path
"""

EXAMPLES = r"""
- name: Start the server and wait until it serves
  gpunode.core.gpunode_stage:
    stage: serve
    hostfile: /etc/gpunode/host.yml
    host: pve1
  delegate_to: localhost
"""

RETURN = r"""
gpunode_summary:
  description: What the stage did, one line each.
  returned: always
  type: str
data:
  description: The stage's record (for example the image tag and verify result, or the P2P verdict).
  returned: always
  type: dict
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import guard


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
    guard.run(module, "gpunode_stage", _run)


def _run(module: AnsibleModule) -> None:
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
    main()
