#!/usr/bin/python

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_lxc_gpu
short_description: Create and keep an LXC container with NVIDIA GPUs passed through (devN)
description:
  - Converges one LXC container through the Proxmox VE API to a desired config, with one C(devN) entry per
    NVIDIA device node the host really has, and leaves it running.
  - Each device path keeps the C(devN) key it has in the container's config; a new path takes the lowest free key,
    a path no longer wanted has its key deleted, and C(devN) entries for other devices (the operator's) stay.
  - Reads the Proxmox VE version once (C(GET /version)) and applies its hot-plug rules to a running container in
    check mode, warnings and O(allow_restart) - PVE 9.0 and later apply a new C(devN) or C(mpN) at once, a changed
    or removed one and C(features) at the next start; PVE 8 applies no C(devN) change before the next start.
  - Refuses before any write when a C(devN) path is not a character device on the host, also when the running
    container already carries one the host lost (Proxmox would fail every config update).
  - A refusal Proxmox would repeat (a missing device, a bad SSH key, a parameter or permission refusal) fails at
    once with Proxmox's message and the fix; only connection errors and transient answers are retried.
  - Thin over the gpunode package (gpunode.stages.container, on proxmoxer). Runs on the controller (delegated to localhost)
    with gpunode's interpreter, because the API is reached from there.
  - Owns only what it made. A container it creates carries the C(gpunode) tag and a description line naming the
    host; an existing container without the tag is refused before any write unless O(adopt) is set, and is never
    destroyed, adopted or not.
  - C(devN) is root@pam only; an API token is refused before any request.
version_added: 0.1.0
author:
  - gpunode developers (!UNKNOWN)
requirements:
  - the gpunode Python package (and proxmoxer) on the controller
attributes:
  check_mode:
    description: Reports what would be created or changed, writing nothing.
    support: full
  diff_mode:
    description: Shows the live config against the desired one.
    support: full
options:
  api_url:
    description: The Proxmox VE API, for example V(https://pve1:8006).
    type: str
    required: true
  node:
    description: The Proxmox node name.
    type: str
    required: true
  auth_method:
    description:
      - V(password) logs in as O(user) with a ticket; V(token) uses an API token (refused, since devN is root@pam only);
        V(local) runs pvesh on the Proxmox host itself.
    type: str
    choices: [password, token, local]
    default: password
  user:
    description: The API user.
    type: str
    default: root@pam
  password_file:
    description: File holding the password of O(user).
    type: path
  password:
    description: The password itself (from ansible-vault). Prefer O(password_file).
    type: str
  token_id:
    description: API token id (the name after the C(!)).
    type: str
  token_secret_file:
    description: File holding the API token's secret.
    type: path
  token_secret:
    description: The token secret itself (from ansible-vault). Prefer O(token_secret_file).
    type: str
  tls_verify:
    description: Verify the API's certificate.
    type: bool
    default: true
  ca_file:
    description: CA certificate to verify the API against.
    type: path
  fingerprint:
    description: SHA-256 fingerprint of the API's certificate to pin (C(AA:BB:...)); the login goes through the pin too.
    type: str
  task_timeout_s:
    description: How long to wait for each Proxmox task (UPID), in seconds.
    type: int
    default: 300
  config:
    description:
      - The desired container config without devN entries (POST /nodes/{node}/lxc parameters).
      - A C(devN) key here is refused; devices come from O(devices), placed by path.
    type: dict
    required: true
  devices:
    description:
      - The NVIDIA device nodes found on the host - the C(devices) map of M(gpunode.core.nvidia_device_facts)
        (path to facts; only those with C(char) true count), or a list of paths, each taken as a character device.
    type: raw
    required: true
  gpus:
    description: V(all), or a list of C(/dev/nvidiaN) minor numbers.
    type: raw
    default: all
  mig:
    description: Also pass the C(/dev/nvidia-caps) nodes (MIG).
    type: bool
    default: false
  control_nodes:
    description:
      - Nodes the host must have and the container gets.
      - Omitted, gpunode's own list (nvidiactl and the nvidia-uvm pair; C(gpunode.ground.nvidia.CONTROL_NODES)).
    type: list
    elements: str
  optional_nodes:
    description:
      - Nodes the container gets when the host has them.
      - Omitted, gpunode's own list (nvidia-modeset; C(gpunode.ground.nvidia.OPTIONAL_NODES)).
    type: list
    elements: str
  driver_tree:
    description:
      - The host's NVIDIA user-space tree (built by M(gpunode.core.nvidia_driver_tree)), bind-mounted
        read-only at C(/usr/local/nvidia) as an C(mpN) mount point (root@pam only, like devN). A new
        mount point is hot-plugged into a running container; a changed one waits for a restart.
      - Empty or omitted, no driver mount point is managed.
    type: path
  weights_dir:
    description:
      - The folder on the Proxmox host that holds the model's weights (the model stage's store folder of the
        pinned revision, or the host file's C(model.host_path)), bind-mounted read-only at O(weights_target) as
        an C(mpN) mount point. Re-creating the container never touches it, since a bind mount's source is not a volume.
      - Empty or omitted, no weights mount point is managed (weights inside the container).
    type: path
  weights_target:
    description: Where the container sees the weights (the host file's C(model.path)).
    type: path
  driver_tree_root:
    description: The folder holding the trees; the trees any container on the node still mounts below it are returned.
    type: path
    default: /var/lib/gpunode/nvidia
  ssh_public_keys_file:
    description:
      - Public keys injected into the container at creation, one per line (OpenSSH format, authorized_keys
        options allowed). Checked line by line as Proxmox checks them (C(gpunode.hostfile.sshkeys)) before any request;
        a comment line, a private key or a damaged key fails with the file and line.
    type: path
  allow_restart:
    description: Restart a running container when changes wait for it (see RV(pending)).
    type: bool
    default: false
  allow_recreate:
    description: Re-create the container when a change needs it (destroys its disk); never one gpunode did not make.
    type: bool
    default: false
  adopt:
    description: Take over an existing container that does not carry the C(gpunode) tag, and add the mark.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Converge the GPU container
  gpunode.core.pve_lxc_gpu:
    api_url: https://pve1:8006
    node: pve1
    password_file: /root/.pve-pass
    ca_file: /etc/gpunode/pve-root-ca.pem
    config:
      vmid: 200
      hostname: glm5
      ostemplate: local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst
      rootfs: local-lvm:200
      cores: 64
      memory: 524288
      net0: name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1
      features: nesting=1,keyctl=1
      tags: gpunode
    devices: "{{ nodes.devices }}"
    gpus: all
    driver_tree: /var/lib/gpunode/nvidia/580.159.04
  delegate_to: localhost
"""

RETURN = r"""
vmid:
  description: The container's id.
  returned: success
  type: int
created:
  description: The container was created by this run.
  returned: success
  type: bool
adopted:
  description: The container was taken over by this run (O(adopt)).
  returned: success
  type: bool
started:
  description: The container was started by this run.
  returned: success
  type: bool
restarted:
  description: The container was restarted to apply pending changes.
  returned: success
  type: bool
restart_needed:
  description: Changes wait for a restart (see O(allow_restart)).
  returned: success
  type: bool
pending:
  description: Config keys waiting for a restart (predicted by the version's hot-plug rules in check mode).
  returned: success
  type: list
  elements: str
pve_version:
  description: The Proxmox VE version the API reports.
  returned: success
  type: str
  sample: 9.0.10
applies:
  description: Each changed key and when it takes effect, V(live) (at once) or V(restart) (at the next start).
  returned: success
  type: dict
  sample: {dev6: live, dev2: restart}
changes:
  description: Each key that differed, with before, after and how it changes (set, delete, resize, recreate).
  returned: success
  type: list
  elements: dict
actions:
  description: What was done or would be done, in words.
  returned: success
  type: list
  elements: str
requests:
  description: API requests sent, by method.
  returned: always
  type: dict
writes:
  description: Write requests sent (the login not counted); 0 on a converged container.
  returned: success
  type: int
driver_trees_in_use:
  description: Trees below O(driver_tree_root) that a container on the node mounts, live or pending (not to be removed).
  returned: success
  type: list
  elements: str
  sample: [/var/lib/gpunode/nvidia/580.159.04]
gpunode_unreachable:
  description: Set when the API did not answer; gpunode reports the host as unreachable.
  returned: failure
  type: bool
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpunode.core.plugins.module_utils import driver_tree, guard


ARGS = {
    "api_url": {"type": "str", "required": True},
    "node": {"type": "str", "required": True},
    "auth_method": {"type": "str", "choices": ["password", "token", "local"], "default": "password"},
    "user": {"type": "str", "default": "root@pam"},
    "password_file": {"type": "path", "no_log": False},  # a path, not the secret
    "password": {"type": "str", "no_log": True},
    "token_id": {"type": "str"},
    "token_secret_file": {"type": "path", "no_log": False},
    "token_secret": {"type": "str", "no_log": True},
    "tls_verify": {"type": "bool", "default": True},
    "ca_file": {"type": "path"},
    "fingerprint": {"type": "str"},
    "task_timeout_s": {"type": "int", "default": 300},
    "config": {"type": "dict", "required": True},
    "devices": {"type": "raw", "required": True},
    "gpus": {"type": "raw", "default": "all"},
    "mig": {"type": "bool", "default": False},
    "control_nodes": {"type": "list", "elements": "str"},
    "optional_nodes": {"type": "list", "elements": "str"},
    "driver_tree": {"type": "path"},
    "weights_dir": {"type": "path"},
    "weights_target": {"type": "path"},
    "driver_tree_root": {"type": "path", "default": driver_tree.TREE_ROOT},
    "ssh_public_keys_file": {"type": "path"},
    "allow_restart": {"type": "bool", "default": False},
    "allow_recreate": {"type": "bool", "default": False},
    "adopt": {"type": "bool", "default": False},
}


def _secret(module: AnsibleModule, value_key: str, file_key: str) -> str | None:
    if module.params[value_key]:
        return module.params[value_key]
    path = module.params[file_key]
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            module.fail_json(msg=f"cannot read {file_key} {path}: {exc.strerror}")
    return None


def _lines(config: dict) -> str:
    return "".join(f"{key}: {config[key]}\n" for key in sorted(config))


def main() -> None:
    module = AnsibleModule(argument_spec=ARGS, supports_check_mode=True)
    guard.run(module, "pve_lxc_gpu", _run)


def _run(module: AnsibleModule) -> None:
    try:
        from gpunode.stages.container import lxc
        from gpunode.stages.container.client import Connection, PveClient, PveError, PveUnreachable
    except ImportError as exc:
        module.fail_json(msg=f"gpunode is not importable by {module._name}'s interpreter ({exc}): "
                             "run it through gpunode, which sets ansible_python_interpreter for localhost")
    p = module.params
    if not isinstance(p["devices"], (list, dict)):
        module.fail_json(msg=f"devices: want a list of node paths or nvidia_device_facts' devices map, "
                             f"not {type(p['devices']).__name__}; nothing was changed")
    try:
        lists = {key: tuple(p[f"{key}_nodes"]) for key in ("control", "optional") if p[f"{key}_nodes"] is not None}
        found, not_char = lxc.char_nodes(p["devices"])
        devices = lxc.wanted_devices(found, p["gpus"], p["mig"], not_char=not_char, **lists)
    except ValueError as exc:
        module.fail_json(msg=f"GPU device nodes: {exc}; nothing was changed")
    desired = dict(p["config"])
    if p["ssh_public_keys_file"]:
        from gpunode.hostfile import sshkeys

        # Checked as Proxmox checks them (a bad line is its HTTP 500 "SSH public key validation
        # error", naming no line): here the message names the file and the line, before any request.
        try:
            desired["ssh-public-keys"] = sshkeys.load(Path(p["ssh_public_keys_file"]))  # type path: expanded
        except sshkeys.KeysFileError as exc:
            module.fail_json(msg=f"container.ssh_public_keys: {exc}; nothing was changed")
    if not p["tls_verify"]:
        module.warn(f"TLS verification of {p['api_url']} is off: credentials can be read on the path")
    conn = Connection(
        url=p["api_url"], node=p["node"], method=p["auth_method"], user=p["user"],
        password=_secret(module, "password", "password_file"), token_id=p["token_id"],
        token_secret=_secret(module, "token_secret", "token_secret_file"), verify=p["tls_verify"],
        ca_file=p["ca_file"], fingerprint=p["fingerprint"], task_timeout_s=float(p["task_timeout_s"]),
    )
    client = PveClient(conn)
    mounts = lxc.driver_mount(p["driver_tree"]) if p["driver_tree"] else {}
    if p["weights_dir"]:
        if not p["weights_target"]:
            module.fail_json(msg="weights_dir needs weights_target (where the container sees the weights); nothing was changed")
        mounts.update(lxc.model_mount(p["weights_dir"], p["weights_target"]))
    try:
        result = lxc.ensure(client, p["node"], desired, check_mode=module.check_mode,
                            allow_restart=p["allow_restart"], allow_recreate=p["allow_recreate"], adopt=p["adopt"],
                            mounts=mounts, devices=devices, host_nodes=found)
        in_use = lxc.mounted_sources(client, p["node"], p["driver_tree_root"])
    except PveUnreachable as exc:
        # Runs on localhost, so Ansible would call it a plain failure: gpunode reads this flag
        # and reports the host as unreachable (exit 3).
        module.fail_json(msg=str(exc), gpunode_unreachable=True, requests=dict(client.counts))
    except PveError as exc:
        module.fail_json(msg=str(exc), requests=dict(client.counts))
    for warning in result.warnings:
        module.warn(warning)
    summary = "; ".join(result.actions) or f"container {result.vmid} matches the host file"
    module.exit_json(
        changed=result.changed,
        vmid=result.vmid,
        created=result.created,
        adopted=result.adopted,
        started=result.started,
        restarted=result.restarted,
        restart_needed=result.restart_needed,
        pending=result.pending,
        pve_version=result.pve_version,
        applies=result.applies,
        changes=[{"key": c.key, "before": c.before, "after": c.after, "how": c.how} for c in result.changes],
        actions=result.actions,
        requests=dict(client.counts),
        writes=client.writes,
        driver_trees_in_use=in_use,
        gpunode_summary=summary,
        diff={"before": _lines(result.before), "after": _lines(result.after),
              "before_header": f"container {result.vmid} (live)", "after_header": f"container {result.vmid} (host file)"},
    )


if __name__ == "__main__":
    main()
