"""Turn a validated host file into an Ansible inventory (references to secrets only, never values)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpunode.hostfile import Host, HostFile, SecretRef, Ssh
from gpunode.paths import MODULE_UTILS, PACKAGE
from gpunode.plan import CONTROL_NODES, container_config, image_tag, server_image, server_launch
from gpunode.serve.spec import CONTAINER_NAME


# Secret files by (host name, field): paths only; the values stay in the files.
SecretFiles = dict[tuple[str, str], Path]


def _ssh_vars(ssh: Ssh) -> dict[str, Any]:
    if ssh.connection == "local":
        return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hostvars: dict[str, Any] = {
        "ansible_host": ssh.address,
        "ansible_port": ssh.port,
        "ansible_user": ssh.user,
    }
    if ssh.key_file is not None:
        hostvars["ansible_ssh_private_key_file"] = str(ssh.key_file.expanduser())
    if ssh.known_hosts is not None:
        # Host keys are checked: a node answering with another key is not our node.
        hostvars["ansible_ssh_common_args"] = (
            f"-o UserKnownHostsFile={ssh.known_hosts.expanduser()} -o StrictHostKeyChecking=yes"
        )
    return hostvars


def node_name(host: Host) -> str:
    """Inventory name of a host's GPU container."""
    return f"{host.name}-ct{host.container.vmid}"


def _node_vars(host: Host, secrets: SecretFiles, source: Path | None) -> dict[str, Any]:
    gpus = host.container.gpus
    launch = server_launch(host)
    api_key = secrets.get((host.name, "api_key"))
    return {
        "gpunode_hostfile": str(source.resolve()) if source else None,
        "gpunode_server_api_key_file": str(api_key) if api_key else None,
        **_ssh_vars(host.container.reach),
        "gpunode_pve_host": host.name,
        "gpunode_lab": host.lab,
        "gpunode_node_hostname": host.container.hostname,
        "gpunode_node_gpus": gpus,
        "gpunode_node_control_nodes": [path for path, when in CONTROL_NODES if when == "always"],
        "gpunode_node_optional_nodes": [path for path, when in CONTROL_NODES if when != "always"],
        "gpunode_driver_version": host.driver.version,
        "gpunode_driver_installer": host.driver.installer.model_dump(mode="json"),
        "gpunode_gpu_handoff": host.container.gpu_handoff,
        "gpunode_image_tag": image_tag(host),
        "gpunode_image_pins": host.image.pinned(),
        "gpunode_image_stand_in": host.image.lab_stand_in,
        "gpunode_server_image": server_image(host),
        "gpunode_server_container": CONTAINER_NAME,
        "gpunode_model_id": host.model.id,
        "gpunode_model_path": str(host.model.path),
        "gpunode_served_name": host.served_name,
        "gpunode_server_bind": host.server.bind,
        "gpunode_server_port": host.server.port,
        "gpunode_server_argv": list(launch.argv),
        "gpunode_server_env": launch.env,
        "gpunode_probe_sources": [str(MODULE_UTILS / "nvidia_nodes.py"), str(PACKAGE / "probe" / "cuda_probe.py")],
    }


def _secret_vars(host: Host, secrets: SecretFiles) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, ref in (("password", host.api.auth.password), ("token_secret", host.api.auth.token_secret)):
        if ref is None:
            continue
        if ref.vault is not None:
            out[f"gpunode_api_{field}_vault"] = str(ref.vault.expanduser())
        else:
            out[f"gpunode_api_{field}_file"] = str(secrets[(host.name, field)])
    return out


def _host_vars(host: Host, secrets: SecretFiles) -> dict[str, Any]:
    auth = host.api.auth
    return {
        **_ssh_vars(host.ssh),
        **_secret_vars(host, secrets),
        "gpunode_dev_root": str(host.dev_root),
        "gpunode_facts_root": str(host.facts_root),
        "gpunode_driver_installer": host.driver.installer.model_dump(mode="json"),
        "gpunode_container_ssh_public_keys": str(host.container.ssh_public_keys.expanduser())
        if host.container.ssh_public_keys else None,
        "gpunode_lab": host.lab,
        "gpunode_api_url": host.api.url,
        "gpunode_api_node": host.api.node,
        "gpunode_api_auth_method": auth.method,
        "gpunode_api_user": auth.user,
        "gpunode_api_token_id": auth.token_id,
        "gpunode_api_tls_verify": host.api.tls.verify,
        "gpunode_api_tls_ca_file": str(host.api.tls.ca_file) if host.api.tls.ca_file else None,
        "gpunode_api_tls_fingerprint": host.api.tls.fingerprint,
        "gpunode_api_timeout_s": host.api.timeout_s,
        "gpunode_container": container_config(host.container, host.name, with_devices=False),
        "gpunode_container_gpus": host.container.gpus,
        "gpunode_container_mig": host.container.mig,
        "gpunode_driver_mount": host.container.gpu_handoff == "host-driver",
        "gpunode_driver_version": host.driver.version,
        "gpunode_prepare": host.prepare.model_dump(),
        "gpunode_node": node_name(host),
    }


def build(hostfile: HostFile, secrets: SecretFiles | None = None, source: Path | None = None) -> dict[str, Any]:
    """The inventory; ``source`` is the host file's path (the GPU-side stages re-read it)."""
    secrets = secrets or {}
    return {
        "all": {
            # API modules run here, with gpunode's own interpreter (they import gpunode).
            "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
            "children": {
                "pve_hosts": {"hosts": {host.name: _host_vars(host, secrets) for host in hostfile.hosts}},
                "gpu_nodes": {"hosts": {node_name(host): _node_vars(host, secrets, source) for host in hostfile.hosts}},
            }
        }
    }


def secret_refs(hostfile: HostFile) -> dict[tuple[str, str], SecretRef]:
    """Every secret the host file names, by (host name, field)."""
    refs: dict[tuple[str, str], SecretRef] = {}
    for host in hostfile.hosts:
        for field, ref in (("password", host.api.auth.password), ("token_secret", host.api.auth.token_secret),
                           ("api_key", host.server.api_key)):
            if ref is not None:
                refs[(host.name, field)] = ref
    return refs


def secret_env_names(hostfile: HostFile) -> set[str]:
    """Environment variables the host file names as secrets (kept out of Ansible's environment)."""
    return {ref.env for ref in secret_refs(hostfile).values() if ref.env}
