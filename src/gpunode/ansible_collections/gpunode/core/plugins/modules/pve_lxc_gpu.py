#!/usr/bin/python
"""Ansible module: converge the GPU LXC container through the Proxmox API.

Thin: parameters in, gpunode.pve.lxc.ensure out. Runs on the controller (delegate_to: localhost,
with gpunode's own interpreter), because the API is reached from there. Check mode reports what
would be created or changed without writing.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: pve_lxc_gpu
short_description: Create and keep an LXC container with NVIDIA GPUs passed through (devN)
options:
  api_url: {type: str, required: true}
  node: {type: str, required: true}
  auth_method: {type: str, choices: [password, token, local], default: password}
  user: {type: str, default: root@pam}
  password_file: {type: path, description: file holding the root@pam password}
  password: {type: str, no_log: true, description: the password itself (from ansible-vault)}
  token_id: {type: str}
  token_secret_file: {type: path}
  token_secret: {type: str, no_log: true}
  tls_verify: {type: bool, default: true}
  ca_file: {type: path}
  fingerprint: {type: str}
  task_timeout_s: {type: int, default: 300}
  config: {type: dict, required: true, description: desired config without devN entries}
  devices: {type: list, elements: str, required: true, description: NVIDIA node paths found on the host}
  gpus: {type: raw, default: all}
  mig: {type: bool, default: false}
  control_nodes: {type: list, elements: str, required: true}
  optional_nodes: {type: list, elements: str, default: []}
  ssh_public_keys_file: {type: path}
  allow_restart: {type: bool, default: false}
  allow_recreate: {type: bool, default: false}
  adopt: {type: bool, default: false, description: take over a container gpunode did not make (adds its mark)}
"""

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
    "devices": {"type": "list", "elements": "str", "required": True},
    "gpus": {"type": "raw", "default": "all"},
    "mig": {"type": "bool", "default": False},
    "control_nodes": {"type": "list", "elements": "str", "required": True},
    "optional_nodes": {"type": "list", "elements": "str", "default": []},
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
    try:
        from gpunode.pve import lxc
        from gpunode.pve.client import Connection, PveClient, PveError, PveUnreachable
    except ImportError as exc:
        module.fail_json(msg=f"gpunode is not importable by {module._name}'s interpreter ({exc}): "
                             "run it through gpunode, which sets ansible_python_interpreter for localhost")
    p = module.params
    try:
        devices = lxc.device_entries(p["devices"], p["gpus"], p["mig"], p["control_nodes"], p["optional_nodes"])
    except ValueError as exc:
        module.fail_json(msg=f"GPU device nodes: {exc}")
    desired = {**p["config"], **devices}
    if p["ssh_public_keys_file"]:
        keys_file = Path(p["ssh_public_keys_file"]).expanduser()
        try:
            desired["ssh-public-keys"] = keys_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            module.fail_json(msg=f"container.ssh_public_keys: cannot read {keys_file}: "
                                 f"{getattr(exc, 'strerror', None) or exc}; nothing was changed")
    if not p["tls_verify"]:
        module.warn(f"TLS verification of {p['api_url']} is off: credentials can be read on the path")
    conn = Connection(
        url=p["api_url"], node=p["node"], method=p["auth_method"], user=p["user"],
        password=_secret(module, "password", "password_file"), token_id=p["token_id"],
        token_secret=_secret(module, "token_secret", "token_secret_file"), verify=p["tls_verify"],
        ca_file=p["ca_file"], fingerprint=p["fingerprint"], task_timeout_s=float(p["task_timeout_s"]),
    )
    client = PveClient(conn)
    try:
        result = lxc.ensure(client, p["node"], desired, check_mode=module.check_mode,
                            allow_restart=p["allow_restart"], allow_recreate=p["allow_recreate"], adopt=p["adopt"])
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
        changes=[{"key": c.key, "before": c.before, "after": c.after, "how": c.how} for c in result.changes],
        actions=result.actions,
        requests=dict(client.counts),
        writes=client.writes,
        gpunode_summary=summary,
        diff={"before": _lines(result.before), "after": _lines(result.after),
              "before_header": f"container {result.vmid} (live)", "after_header": f"container {result.vmid} (host file)"},
    )


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
