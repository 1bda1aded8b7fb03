"""The model: section's rules, what derive and plan make of it, the container's read-only mount of
the store, and the serve stage's refusal of weights the model stage did not prove whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode import hostfile
from gpunode.derive import derive
from gpunode.derive.plan import model_section
from gpunode.stages.container import lxc
from gpunode.stages.model.stage import progress_line, refusal

ROOT = Path(__file__).resolve().parents[2]
REV = "0123456789abcdef0123456789abcdef01234567"
HUB = {"source": "hub", "revision": REV, "store": "/tank/models"}


def host_with(tmp_path: Path, **model: Any) -> hostfile.Host:
    data = yaml.safe_load((ROOT / "inventory/lab/host.yml").read_text())
    data["hosts"][0]["model"].update(model)
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(data))
    return hostfile.load(path).hosts[0]


def problem(tmp_path: Path, **model: Any) -> str:
    with pytest.raises(hostfile.HostFileError) as caught:
        host_with(tmp_path, **model)
    return str(caught.value)


@pytest.mark.parametrize("model,needle", [
    ({"source": "hub", "store": "/tank"}, "source: hub needs model.revision"),
    ({**HUB, "revision": "main"}, "is not a pinned revision"),
    ({**HUB, "endpoint": "https://user:pw@hub.example"}, "user information"),
    ({**HUB, "endpoint": "ftp://hub.example"}, "is not an http(s) URL"),
    ({**HUB, "token": {"vault": "/x.vault"}}, "model.token: give {env: NAME} or {file: PATH}"),
    ({**HUB, "store": "/proc/models"}, "under a system folder"),
    ({**HUB, "store": "/tank/../etc"}, "'..'"),
    ({"source": "node_path", "revision": REV}, "model.revision is for source: hub"),
    ({"source": "host_path"}, "source: host_path needs model.host_path"),
    ({**HUB, "host_path": "/tank/x"}, "model.host_path is for source: host_path"),
])
def test_the_model_sections_rules(tmp_path: Path, model: dict[str, Any], needle: str) -> None:
    assert needle in problem(tmp_path, **model)


def test_a_hub_model_lives_in_the_store_and_is_mounted_read_only(tmp_path: Path) -> None:
    host = host_with(tmp_path, **HUB)
    plan = derive(host).model
    assert plan.weights_dir == f"/tank/models/lukealonso--GLM-5-NVFP4/{REV}" and plan.on == "host"
    assert plan.manifest == f"/tank/models/lukealonso--GLM-5-NVFP4/{REV}.manifest.json"
    assert lxc.model_mount(plan.mount_source, plan.mount_target) == {
        "/models/GLM-5-NVFP4": f"{plan.weights_dir},mp=/models/GLM-5-NVFP4,ro=1"}
    section = model_section(host, derive(host))
    assert section["revision"] == REV and "keeps them" in section["recreate"] and section["verify"] == "sizes"


def test_weights_inside_the_node_are_not_mounted_and_plan_says_recreate_destroys_them(tmp_path: Path) -> None:
    host = host_with(tmp_path)
    plan = derive(host).model
    assert plan.on == "node" and plan.mount_source is None and lxc.model_mount(None, plan.mount_target) == {}
    assert "DESTROYS" in model_section(host, derive(host))["recreate"]


def test_the_serve_stage_refuses_what_was_not_verified(tmp_path: Path) -> None:
    plan = derive(host_with(tmp_path, **HUB)).model
    ok = {"ok": True, "repo": plan.repo, "revision": plan.revision, "weights_dir": plan.weights_dir}
    assert refusal(plan, json.dumps(ok)) is None
    assert "has not verified" in (refusal(plan, None) or "")
    assert "not the model stage's record" in (refusal(plan, "{") or "")
    other = refusal(plan, json.dumps({**ok, "revision": "f" * 40}))
    assert other and f"the host file's are {plan.repo} at {REV}" in other
    bad = refusal(plan, json.dumps({**ok, "ok": False, "findings": ["sha256 model-00002-of-00003.safetensors: x"]}))
    assert bad and "sha256 model-00002-of-00003.safetensors" in bad


def test_the_progress_line_says_bytes_rate_and_eta() -> None:
    line = progress_line({"progress": {"bytes": 12_300_000_000, "total": 450_000_000_000, "rate": 1_210_000_000,
                                       "eta_s": 372}})
    assert line == "model: fetched 12.30 GB of 450.00 GB, 1.21 GB/s, ETA 6m12s"
    assert progress_line({"result": {}}) is None
