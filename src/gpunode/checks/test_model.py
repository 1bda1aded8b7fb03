"""Layer model: the weights the server mounts, proven whole now (no network: the manifest the model
stage kept beside them), and the node's record of the model stage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpunode.checks import tail
from gpunode.checks.conftest import _groups, node_record
from gpunode.derive.modelplan import ModelPlan
from gpunode.stages.model.stage import stale_mount

FIX = "run `gpunode provision --tags model`"


def test_model_weights_verified(host: Any, gpunode_derived: dict[str, Any]) -> None:
    """The model tools' verify, where the weights are: every file with its size (and its hash where
    the level or a changed file asks), the safetensors headers, the index and config.json."""
    groups = _groups(host)
    if not {"pve_hosts", "gpu_nodes"} & set(groups):
        pytest.skip("not-in-layer: neither a Proxmox host nor a GPU container (the router holds no weights)")
    model = gpunode_derived["model"]
    on = "pve_hosts" if model["on"] == "host" else "gpu_nodes"
    if on not in groups:
        pytest.skip(f"not-in-layer: the weights are on the {'Proxmox host' if on == 'pve_hosts' else 'GPU node'}")
    lib, python = f"{model['tools_dir']}/lib", f"{model['tools_dir']}/venv/bin/python"
    request = json.dumps({"plan": model, "token": None})
    result = host.run("printf %s %s | env PYTHONPATH=%s %s -s -m gpunode.stages.model verify", "%s", request, lib, python)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    errors = [line["error"] for line in lines if "error" in line]
    verdicts = [line["result"]["verify"] for line in lines if "result" in line]
    if not verdicts:
        pytest.fail(f"the model tools did not run there (exit {result.rc}): "
                    f"{errors[0] if errors else tail(result.stderr) or 'no output'} -> {FIX}")
    verify = verdicts[-1]
    problems = "; ".join(f"{f['code']} {f['subject']}: {f['message']} (fix: {f['fix']})" for f in verify["findings"])
    more = "".join(f"; {count} more {code}" for code, count in (verify.get("more") or {}).items())
    assert verify["ok"], f"{model['weights_dir']} is not the revision whole ({verify['level']}): {problems}{more}"


def test_model_record(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    """The model stage's record on the node says the weights the server mounts were verified."""
    model = gpunode_derived["model"]
    record = node_record(gpu_node, "model")
    if record is None:
        pytest.fail(f"no model record on the node (/etc/gpunode/model.json) -> {FIX}")
    assert (record["repo"], record["revision"], record["weights_dir"]) == (
        model["repo"], model["revision"], model["weights_dir"]), (
        f"the record is of {record['repo']} at {record['revision']} in {record['weights_dir']}, the host file's is "
        f"{model['repo']} at {model['revision']} in {model['weights_dir']} -> {FIX}")
    assert record["ok"], f"the model stage did not verify it: {'; '.join(record['findings'])} -> {FIX}"


def test_model_mount_is_live(gpu_node: Any, gpunode_derived: dict[str, Any], gpunode_host: dict[str, Any]) -> None:
    """The node's weights folder is the store's, not one deleted on the host while the container ran
    (a bind mount keeps the deleted folder: no links, empty to the server)."""
    model = gpunode_derived["model"]
    if model["mount_source"] is None:
        pytest.skip("not-in-layer: the weights are in the container itself (model.source: node_path), not mounted")
    links = gpu_node.run("stat -c %%h -- %s", model["mount_target"])
    assert links.rc == 0, f"{model['mount_target']} is not on the node ({tail(links.stderr)}) -> {FIX}"
    stale = stale_mount(ModelPlan.model_validate(model), int(gpunode_host["container"]["vmid"]),
                        int(links.stdout) if links.stdout.strip().isdigit() else None)
    assert stale is None, stale

