"""docker_run's decisions without a Docker daemon: what changed, the key file, an unreachable daemon,
and Docker's refusals turned into diagnoses."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpunode import hostfile
from gpunode.catalogue import handoff
from gpunode.stages.serve import docker_run
from gpunode.derive import serverspec as specs
from gpunode.stages.serve.command import EXIT_BAD_INPUT, EXIT_UNREACHABLE, run_serve
from gpunode.stages.serve.diagnose import diagnose_docker_error

EXAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "example" / "host.yml"


def spec_with(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"image": "img:1", "argv": ["python3", "-m", "sglang.launch_server", "--port", "1"],
                            "env": {"A": "1"}, "model_dir": "/m", "bind": "127.0.0.1", "port": 1,
                            "gpus": handoff.GpuHandoff.runtime("all")}
    return specs.container_spec(**{**base, **changes})


class Labelled:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels


def test_changed_settings_names_what_differs() -> None:
    old = spec_with()
    assert docker_run.changed_settings(Labelled(old["labels"]), spec_with()) == []
    assert docker_run.changed_settings(Labelled(old["labels"]), spec_with(image="img:2")) == ["image"]
    assert docker_run.changed_settings(Labelled(old["labels"]), spec_with(env={"A": "2"}, port=2)) == [
        "environment", "ports"]
    assert docker_run.changed_settings(Labelled(old["labels"]), spec_with(api_key=True)) == ["command"]
    assert docker_run.changed_settings(Labelled({}), spec_with()) == [
        "settings (the container was not made by gpunode serve)"]


def test_key_archive_holds_one_private_file_and_its_launcher() -> None:
    data = docker_run._key_archive(docker_run.server_key("k-123"))
    launcher, content = specs.launcher()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == sorted(["run", "run/gpunode", "run/gpunode/sglang-api-key.json", launcher[1:]])
        assert members["run/gpunode/sglang-api-key.json"].mode == 0o400
        assert members[launcher[1:]].mode == 0o444 and tar.extractfile(launcher[1:]).read() == content
        assert members["run/gpunode"].mode == 0o700 and members["run/gpunode"].isdir()
    assert docker_run._file_from_archive([data]) == specs.api_key_file_content("k-123")
    assert json.loads(specs.api_key_file_content('we"ird\\key')) == {"api-key": 'we"ird\\key'}


@pytest.mark.parametrize(("message", "key"), [
    ('invalid mount config for type "bind": bind source path does not exist: /models/GLM-5-NVFP4', "bind_source_missing"),
    ('could not select device driver "" with capabilities: [[gpu]]', "nvidia_runtime_missing"),
    ("error gathering device information while adding custom device \"/dev/nvidia7\": no such file or directory",
     "device_node_missing"),
    ("driver failed programming external connectivity: Bind for 127.0.0.1:30000 failed: port is already allocated",
     "port_in_use"),
    ("No such image: gpunode/sglang:0.5.9-cu128-abc", "image_missing"),
])
def test_docker_refusals_are_diagnosed(message: str, key: str) -> None:
    found = diagnose_docker_error(message, model_path="/models/GLM-5-NVFP4", image="gpunode/sglang:x")
    assert found is not None and found.key == key and found.fix
    assert diagnose_docker_error("something else entirely") is None


def test_unreachable_docker_is_said_so() -> None:
    host = hostfile.load(EXAMPLE).hosts[0]
    console = Console(file=io.StringIO(), width=200)
    outcome = run_serve(host, "img:1", "unix:///nonexistent/docker.sock", console, 5)
    assert outcome.exit_code == EXIT_UNREACHABLE
    assert "unreachable" in console.file.getvalue()  # type: ignore[attr-defined]


def test_unreadable_api_key_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    host = hostfile.load(EXAMPLE).hosts[0]
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    exposed = host.model_copy(update={"server": host.server.model_copy(update={
        "bind": "0.0.0.0", "api_key": hostfile.SecretRef(env="NO_SUCH_KEY_VAR")})})
    console = Console(file=io.StringIO(), width=200)
    outcome = run_serve(exposed, "img:1", None, console, 5)
    assert outcome.exit_code == EXIT_BAD_INPUT
    assert "NO_SUCH_KEY_VAR is not set" in console.file.getvalue()  # type: ignore[attr-defined]
