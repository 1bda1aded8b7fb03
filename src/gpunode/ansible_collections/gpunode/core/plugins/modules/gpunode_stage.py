#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: gpunode_stage
short_description: Run a GPU-side provision stage on a node's Docker engine
description:
  - Runs one of gpunode's GPU-side stages (image, p2p, serve, smoke) for one host, through the gpunode
    Python package, against the node's Docker engine over SSH; or the router stage, against the router
    machine's engine; or the model stage, which runs the model tools over SSH on the machine that holds
    the weights (the Proxmox host, or the node for weights already inside it).
  - Takes the host as gpunode's inventory carries it (the validated host file entry, C(gpunode_host))
    and the values derived from it once (C(gpunode_derived)); it parses no host file and computes
    none of those values again.
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
    choices: [model, image, p2p, serve, smoke, router, monitor]
  host:
    description:
      - The host file's entry for this host, validated, as data (the inventory's C(gpunode_host)).
      - For the router stage, the host file's router section (the inventory's C(gpunode_router)).
    type: dict
    required: true
  derived:
    description: The values gpunode derived from it (the inventory's C(gpunode_derived)).
    type: dict
    required: true
  api_key_file:
    description: The run's file holding the server's (or for the router stage, the router's) API key, when the host file names one.
    type: path
  fabric:
    description:
      - For the p2p stage, the PCIe fabric under the GPUs as the node's Proxmox host reads it (the C(fabric) of
        M(gpunode.core.nvidia_host_facts)), so that the verdict can name ACS, BAR1 and the driver's P2P mode as
        causes. Without it the verdict says the fabric was not judged.
      - Refused for the router stage, which has no GPUs.
    type: dict
  hub_token_file:
    description:
      - For the model stage, the run's file holding the Hugging Face Hub token (C(model.token) of the host file).
        The stage hands it to the fetch on the machine that holds the weights through the command's input, never
        as an argument or in the environment. Refused for the other stages.
    type: path
"""

EXAMPLES = r"""
- name: Start the server and wait until it serves
  gpunode.core.gpunode_stage:
    stage: serve
    host: "{{ gpunode_host }}"
    derived: "{{ gpunode_derived }}"
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import guard


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "stage": {"type": "str", "required": True, "choices": ["model", "image", "p2p", "serve", "smoke", "router", "monitor"]},
            "host": {"type": "dict", "required": True},
            "derived": {"type": "dict", "required": True},
            "api_key_file": {"type": "path", "no_log": False},
            "fabric": {"type": "dict"},
            "hub_token_file": {"type": "path", "no_log": False},
        },
        supports_check_mode=True,
    )
    guard.run(module, "gpunode_stage", _run)


def _run(module: AnsibleModule) -> None:
    from pydantic import ValidationError

    from gpunode.stages import common as stage
    from gpunode.stages.engine import EngineUnreachable

    p = module.params
    try:
        target = stage.target_from_data(p["stage"], p["host"], p["derived"], p["api_key_file"], p["fabric"],
                                        p["hub_token_file"])
    except ValidationError as exc:
        # Data gpunode's own inventory did not write (an edited inventory, another gpunode's): one line.
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        module.fail_json(msg=f"{p['stage']}: the host data is not what this gpunode writes ({exc.title}): "
                             f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}{more}")
    except ValueError as exc:  # input the stage refuses (a fabric for the router)
        module.fail_json(msg=f"{p['stage']}: {exc}")
    try:
        result = stage.run(p["stage"], target, module.check_mode)
    except EngineUnreachable as exc:
        module.fail_json(msg=str(exc))
    summary = "\n".join(result.summary)
    if result.failed:
        # gpunode_unreachable: the machine (or the Hub) did not answer; gpunode reports exit 3.
        module.fail_json(msg=f"{p['stage']}: {result.failure()}",
                         gpunode_summary=summary, data=result.data, gpunode_unreachable=result.unreachable)
    module.exit_json(changed=result.changed, gpunode_summary=summary, data=result.data)


if __name__ == "__main__":
    main()
