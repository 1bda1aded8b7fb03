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
    lab = data["hosts"][0]["model"]
    # From the lab's model without where its weights come from (the lab fetches from its Hub): node_path.
    data["hosts"][0]["model"] = {**{k: lab[k] for k in ("id", "path", "served_name")}, **model}
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
    ({**HUB, "store": "/tank/x,ro=0"}, "a path with ',', '=' cannot be a Proxmox mount point"),
    ({"path": "/models/a,ro=0"}, "a path with ',', '=' cannot be a Proxmox mount point"),
    ({"source": "host_path", "host_path": "/tank/a\nlxc.cap.drop:"}, "a path with '\\n' cannot be"),
    ({"id": "a--b/c"}, "is not a Hub repo id"),
    ({"id": "org/-rf"}, "is not a Hub repo id"),
    ({"id": "org/" + "x" * 97}, "is not a Hub repo id"),
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
    assert section["tools"].startswith("Debian's python3-venv and python3-packaging") and "Proxmox host" in section["tools"]


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


def test_the_tools_output_is_read_whole_however_much_they_write(tmp_path: Path) -> None:
    """A tool that writes 1 MB to stderr before its result cannot stall on a full stderr pipe while the
    stage reads stdout: stderr is drained beside it, and its end kept for a failure's message."""
    from gpunode.hostfile import Ssh
    from gpunode.stages.model import stage

    plan = derive(host_with(tmp_path)).model.model_copy(update={"tools_dir": str(tmp_path / "tools")})
    python = tmp_path / "tools" / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\ncat >/dev/null\nhead -c 1000000 /dev/zero | tr '\\0' w >&2\n"
                      "echo '{\"result\": {\"verify\": {\"ok\": true}}}'\n")
    python.chmod(0o755)
    code, lines, other = stage.run_tool(Ssh(address="127.0.0.1", connection="local"), plan, "verify", {"plan": {}})
    assert code == 0 and lines == [{"result": {"verify": {"ok": True}}}] and other.startswith("www") \
        and len(other) == 1_000_000


def test_the_runner_shows_the_stages_last_progress_line_and_logs_one_in_ten(tmp_path: Path) -> None:
    import io
    import time

    from gpunode import runner

    shown: list[str] = []
    progress = runner.Progress.__new__(runner.Progress)
    progress.status, progress.log = type("S", (), {"update": lambda self, text: shown.append(text)})(), io.StringIO()
    path = tmp_path / "progress.log"
    with runner.stage_progress(path, progress, every_s=0.01):
        with path.open("a") as handle:
            handle.write("".join(f"model: line {n}\n" for n in range(12)) + "model: half a li")
        time.sleep(0.2)
    assert shown[-1] == "model: line 11" and "half" not in "".join(shown)
    assert [line.split()[-1] for line in progress.log.getvalue().splitlines()] == ["0", "10"]


@pytest.mark.parametrize("check_mode,code,failed,unreachable,needle", [
    (True, 127, False, False, "the tools are not on pve-lab-ct200 yet: a real run installs them"),
    (False, 127, True, False, "No such file"),
    (False, 255, True, True, "ssh to root@10.0.3.10 failed"),
])
def test_the_stage_says_what_its_tools_exit_means(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check_mode: bool,
                                                  code: int, failed: bool, unreachable: bool, needle: str) -> None:
    from gpunode.stages.common import Target
    from gpunode.stages.model import stage

    host = host_with(tmp_path)
    monkeypatch.setattr(stage, "ship_tools", lambda *_a, **_k: False)  # the files there as here
    monkeypatch.setattr(stage, "run_tool", lambda *_a, **_k: (code, [], "env: '/x/venv/bin/python': No such file"))
    result = stage.run(Target(host, derive(host)), None, check_mode)
    assert (result.failed, result.unreachable) == (failed, unreachable) and needle in result.summary[0], result


def test_a_machine_that_does_not_answer_the_file_comparison_is_unreachable(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gpunode.stages.common import Target
    from gpunode.stages.model import stage

    host = host_with(tmp_path)
    said = "ssh to root@10.0.3.10 failed: ssh: connect to host 10.0.3.10 port 22: Connection refused"
    monkeypatch.setattr(stage, "ship_tools", lambda *_a, **_k: said)
    monkeypatch.setattr(stage, "run_tool", lambda *_a, **_k: pytest.fail("the tools ran after the machine failed"))
    result = stage.run(Target(host, derive(host)), None, False)
    assert result.failed and result.unreachable and result.summary == [said]


def test_the_stage_sends_its_model_files_only_when_one_differs(tmp_path: Path) -> None:
    """ship_tools: one call compares every file's sha256 there; the set goes as one tar only when a
    file is missing or differs; check mode says it would, and sends nothing."""
    from gpunode.hostfile import Ssh
    from gpunode.stages.model import stage

    plan = derive(host_with(tmp_path)).model.model_copy(update={"tools_dir": str(tmp_path / "tools")})
    here = Ssh(address="127.0.0.1", connection="local")
    lib = tmp_path / "tools" / "lib"
    assert stage.ship_tools(here, plan, check_mode=True) is True and not lib.exists()
    assert stage.ship_tools(here, plan, check_mode=False) is True
    for source, rel in plan.tool_files:
        assert (lib / rel).read_bytes() == Path(source).read_bytes() and (lib / rel).stat().st_mode & 0o777 == 0o644
    assert stage.ship_tools(here, plan, check_mode=False) is False  # as they are: nothing sent
    edited = lib / plan.tool_files[-1][1]
    edited.write_text(edited.read_text() + "\n# edited there\n")
    assert stage.ship_tools(here, plan, check_mode=True) is True and "edited there" in edited.read_text()
    assert stage.ship_tools(here, plan, check_mode=False) is True and "edited there" not in edited.read_text()
    (lib / plan.tool_files[0][1]).unlink()
    assert stage.ship_tools(here, plan, check_mode=False) is True and stage.ship_tools(here, plan, False) is False
