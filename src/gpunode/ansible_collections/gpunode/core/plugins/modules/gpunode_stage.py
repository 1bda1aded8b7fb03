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
  - Runs on the controller, in Ansible's own process (an action plugin, which this file documents), which needs
    the gpunode package, as gpunode.core's filters do. The task's host is the machine that keeps the record.
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
  record:
    description:
      - Where the task's host keeps the stage's record for C(gpunode check) (the C(record) in the stage's C(data)),
        written by M(ansible.builtin.copy) in the same task, even when the stage fails, so that the check can say
        what failed. Without it, or for a stage that returns no record, nothing is written.
    type: str
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

- name: Smoke-test the server and keep the result on the node
  gpunode.core.gpunode_stage:
    stage: smoke
    host: "{{ gpunode_host }}"
    derived: "{{ gpunode_derived }}"
    record: /etc/gpunode/smoke.json
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
