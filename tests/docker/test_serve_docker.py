"""The real container path with real Docker: ``run_serve`` (the same spec builder and command line as
the real server; only the image differs: a small Debian image whose ``sglang.launch_server`` is the
fake) started, proved ready, re-run without a restart, replaced on change, diagnosed on a crash."""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from rich.console import Console

from gpunode import hostfile
from gpunode.hostfile import Host
from gpunode.catalogue import handoff
from gpunode.stages.serve import docker_run
from gpunode.derive import serverspec as specs
from gpunode.stages.serve.command import ServeOutcome, foresee, run_serve
from gpunode.stages.smoke import bench
from gpunode.stages.smoke.command import smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ports import PortTaken, closed_port, on_free_port  # noqa: E402 - tests/ put on the path just above
from fakes.process import model_dir  # noqa: E402

pytestmark = pytest.mark.docker

EXAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "example" / "host.yml"
QUICK = {"FAKE_SGLANG_LOAD_S": "0.3", "FAKE_SGLANG_AUTOTUNE_S": "0.1", "FAKE_SGLANG_WARMUP_S": "0.3"}


def gpu_nodes(root: Path) -> handoff.GpuHandoff:
    """Character devices with the NVIDIA numbers, handed in one by one (Docker has no NVIDIA runtime here)."""
    dev = root / "dev"
    dev.mkdir()
    numbers = {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255), "nvidia-uvm": (511, 0)}
    try:
        for name, (major, minor) in numbers.items():
            os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod needs root")
    return handoff.GpuHandoff.device_nodes([str(dev / name) for name in numbers], str(dev))


def lab_host(root: Path, *, port: int, model: Path | None = None, **server: Any) -> Host:
    host = hostfile.load(EXAMPLE).hosts[0]
    settings = {"port": port, "flags": {"--tp-size": 2}, "env": dict(QUICK), **server}
    return host.model_copy(update={
        "container": host.container.model_copy(update={"gpus": [0, 1]}),
        "model": host.model.model_copy(update={"path": model if model is not None else model_dir(root)}),
        "server": host.server.model_copy(update=settings),
    })


MEMLOCK = {"bytes": -1}  # set per session by the autouse fixture below


@pytest.fixture(autouse=True)
def _memlock(memlock_bytes: int) -> None:
    MEMLOCK["bytes"] = memlock_bytes


def start(host: Host, image: str, name: str, handoff: handoff.GpuHandoff, timeout_s: float = 60,
          memlock: int | None = None, engine_is_local: bool | None = None) -> tuple[ServeOutcome, str]:
    console = Console(file=io.StringIO(), width=200)
    outcome = run_serve(host, image, None, console, timeout_s, gpu_handoff=handoff, name=name,
                        memlock_bytes=MEMLOCK["bytes"] if memlock is None else memlock,
                        engine_is_local=engine_is_local)
    return outcome, console.file.getvalue()  # type: ignore[attr-defined]


def foreseen(host: Host, image: str, name: str, handoff: handoff.GpuHandoff) -> docker_run.Decision:
    """What a start would do, decided by the code that acts on it, from the same spec; nothing changed."""
    return foresee(host, image, None, gpu_handoff=handoff, name=name, memlock_bytes=MEMLOCK["bytes"])


def start_on_free_port(build: Callable[[int], Host], client: docker.DockerClient, image: str, name: str,
                       handoff: handoff.GpuHandoff, **kwargs: Any) -> tuple[Host, ServeOutcome, str]:
    """The first start of a test's server, on a free port: Docker publishes it, so the port cannot be
    handed over bound (tests/fakes/ports.py); when another process took it first, Docker says so
    (diagnosed port_in_use) and the start is made again, afresh, on another port."""

    def attempt(port: int) -> tuple[Host, ServeOutcome, str]:
        host = build(port)
        outcome, said = start(host, image, name, handoff, **kwargs)
        if outcome.diagnosis is not None and outcome.diagnosis.key == "port_in_use":
            for container in client.containers.list(all=True, filters={"name": name}):
                container.remove(force=True)
            raise PortTaken(port, outcome.diagnosis.evidence)
        return host, outcome, said

    return on_free_port(attempt)


def test_start_ready_then_kept_then_replaced(docker_client: docker.DockerClient, fake_image: str,
                                            container_name: str, tmp_path: Path) -> None:
    handoff = gpu_nodes(tmp_path)
    host, first, said = start_on_free_port(lambda port: lab_host(tmp_path, port=port), docker_client, fake_image,
                                           container_name, handoff)
    assert first.exit_code == 0, said
    assert first.start is not None and first.start.action == "created"
    assert first.readiness is not None and [e.phase for e in first.readiness.events][-3:] == ["http", "fired_up", "ready"]
    assert "loading weights" in said and "ready at http://127.0.0.1:" in said

    container = docker_client.containers.get(container_name)
    attrs = container.attrs
    started_at = attrs["State"]["StartedAt"]
    config, host_config = attrs["Config"], attrs["HostConfig"]
    assert config["Cmd"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert host_config["IpcMode"] == "host" and host_config["Init"] is True
    assert host_config["RestartPolicy"]["Name"] == "unless-stopped"
    assert {u["Name"]: u["Soft"] for u in host_config["Ulimits"]} == {"memlock": MEMLOCK["bytes"],
                                                                       "stack": 64 * 1024 * 1024}
    port = host.server.port
    assert host_config["PortBindings"] == {f"{port}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert set(mounts) == {"/model", "/var/cache/gpunode"} and mounts["/model"]["RW"] is False
    # FlashInfer's JIT cache: a named volume that outlives the container.
    assert mounts["/var/cache/gpunode"]["Type"] == "volume" and mounts["/var/cache/gpunode"]["Name"] == \
        f"{container_name}-jit-cache" and mounts["/var/cache/gpunode"]["RW"] is True
    # The device nodes arrive with NVIDIA's numbers (195 = 0xc3).
    assert container.exec_run(["stat", "-c", "%t:%T", "/dev/nvidia1"]).output.decode().strip() == "c3:1"
    assert config["Env"] and "HF_HUB_OFFLINE=1" in config["Env"]

    # Each start below is foreseen first (check mode and a rolling change read it), and does what was foreseen.
    assert foreseen(host, fake_image, container_name, handoff).action == "kept"
    again, said = start(host, fake_image, container_name, handoff)
    assert again.exit_code == 0 and again.start is not None and again.start.action == "kept", said
    assert again.start.container_id == first.start.container_id
    container.reload()
    assert container.attrs["State"]["StartedAt"] == started_at and container.attrs["RestartCount"] == 0

    # Stopped with the same settings: started again; only this run's log is read.
    container.stop(timeout=5)
    assert foreseen(host, fake_image, container_name, handoff) == docker_run.Decision(
        "started", "same settings; it was exited", docker_run.find_container(docker_client, container_name))
    restarted, said = start(host, fake_image, container_name, handoff)
    assert restarted.exit_code == 0 and restarted.start is not None and restarted.start.action == "started", said
    container.reload()
    assert container.logs().decode().count("server_args=") == 2
    watched = docker_run.DockerServer(container)
    try:
        assert watched.log_text().count("server_args=") == 1
    finally:
        watched.close()

    changed = lab_host(tmp_path, port=port, flags={"--tp-size": 2, "--max-running-requests": 512})
    decision = foreseen(changed, fake_image, container_name, handoff)
    assert (decision.action, decision.reason, decision.restarts) == ("replaced", "changed: command", True)
    assert docker_client.containers.get(container_name).id == restarted.start.container_id  # foreseen, not done
    replaced, said = start(changed, fake_image, container_name, handoff)
    assert replaced.exit_code == 0 and replaced.start is not None and replaced.start.action == "replaced", said
    assert replaced.start.container_id != first.start.container_id and "command" in replaced.start.reason
    assert len(docker_client.containers.list(all=True, filters={"name": container_name})) == 1


def test_api_key_file_smoke_and_key_change(docker_client: docker.DockerClient, fake_image: str,
                                           container_name: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUNODE_TEST_API_KEY", "-docker-key-4f2a9")  # a leading "-": one argument still
    handoff = gpu_nodes(tmp_path)
    host, outcome, said = start_on_free_port(
        lambda port: lab_host(tmp_path, port=port, api_key=hostfile.SecretRef(env="GPUNODE_TEST_API_KEY")),
        docker_client, fake_image, container_name, handoff)
    assert outcome.exit_code == 0, said
    container = docker_client.containers.get(container_name)
    inspected = str(container.attrs)
    assert "-docker-key-4f2a9" not in inspected and "docker-key-4f2a9" not in said
    # The launcher hands sglang the key from its file; the command names only the launcher.
    assert container.attrs["Config"]["Cmd"][:3] == ["python3", specs.launcher()[0], "sglang.launch_server"]
    # The server read the key from the file: no key, 401; the key, every check passes.
    url = f"http://127.0.0.1:{host.server.port}"
    runner = bench.DockerBenchRunner(docker_client, fake_image, str(host.model.path))
    out = io.StringIO()
    assert smoke(url, "glm-5", "-docker-key-4f2a9", runner, True, out) == 0, out.getvalue()
    assert "docker-key-4f2a9" not in out.getvalue()
    assert smoke(url, "glm-5", None, None, True, io.StringIO()) == 1
    assert not docker_client.containers.list(all=True, filters={"label": "io.gpunode.role=sglang-bench"})
    # The exec probe (a remote daemon's way) sees the same readiness.
    assert docker_run.ExecHealthProbe(container, host.server.port)() == 200

    monkeypatch.setenv("GPUNODE_TEST_API_KEY", "another-key-77")
    replaced, said = start(host, fake_image, container_name, handoff)
    assert replaced.start is not None and replaced.start.action == "replaced" and "API key" in replaced.start.reason
    assert smoke(url, "glm-5", "another-key-77", None, True, io.StringIO()) == 0


@pytest.mark.parametrize(("crash", "key"), [("oom", "cuda_oom"), ("cuinit", "cuda_init_hmm")])
def test_crash_is_diagnosed_and_the_container_stopped(docker_client: docker.DockerClient, fake_image: str,
                                                      container_name: str, tmp_path: Path, crash: str,
                                                      key: str) -> None:
    _host, outcome, said = start_on_free_port(
        lambda port: lab_host(tmp_path, port=port, env={**QUICK, "FAKE_SGLANG_CRASH": crash}), docker_client,
        fake_image, container_name, gpu_nodes(tmp_path))
    assert outcome.exit_code == 1 and outcome.readiness is not None and outcome.readiness.exited
    assert outcome.diagnosis is not None and outcome.diagnosis.key == key, said
    assert outcome.readiness.elapsed_s < 10
    assert "fix:" in said and f"docker logs {container_name}" in said
    container = docker_client.containers.get(container_name)
    assert container.status == "exited"  # stopped: unless-stopped does not bring it back in a loop


def test_a_misspelt_server_flag_fails_as_on_the_node(docker_client: docker.DockerClient, fake_image: str,
                                                    container_name: str, tmp_path: Path) -> None:
    """sglang 0.5.9's parser refuses it with exit 2 and these words (run in the real image:
    tests/image/test_stand_in_parser.py); the stand-in does the same, and serve names it."""
    _host, outcome, said = start_on_free_port(
        lambda port: lab_host(tmp_path, port=port, flags={"--tp-size": 2, "--disable-radix-cahce": True}),
        docker_client, fake_image, container_name, gpu_nodes(tmp_path))
    assert outcome.exit_code == 1 and outcome.diagnosis is not None and outcome.diagnosis.key == "bad_argument", said
    assert outcome.diagnosis.evidence == "launch_server.py: error: unrecognized arguments: --disable-radix-cahce"


def test_missing_model_directory_is_refused_by_docker(docker_client: docker.DockerClient, fake_image: str,
                                                      container_name: str, tmp_path: Path) -> None:
    _host, outcome, said = start_on_free_port(
        lambda port: lab_host(tmp_path, port=port, model=tmp_path / "no-such-model"), docker_client, fake_image,
        container_name, gpu_nodes(tmp_path))
    assert outcome.exit_code == 1 and outcome.diagnosis is not None
    assert outcome.diagnosis.key == "bind_source_missing" and "no-such-model" in said
    assert not docker_client.containers.list(all=True, filters={"name": container_name})


def test_empty_model_directory_fails_in_the_server(docker_client: docker.DockerClient, fake_image: str,
                                                   container_name: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    _host, outcome, said = start_on_free_port(lambda port: lab_host(tmp_path, port=port, model=empty), docker_client,
                                              fake_image, container_name, gpu_nodes(tmp_path))
    assert outcome.exit_code == 1 and outcome.diagnosis is not None and outcome.diagnosis.key == "model_dir_empty", said


def test_unlimited_memlock_refused_is_diagnosed(docker_client: docker.DockerClient, fake_image: str,
                                                container_name: str, tmp_path: Path, memlock_bytes: int) -> None:
    if memlock_bytes == -1:
        pytest.skip("this Docker can raise memlock to unlimited: nothing to refuse")
    _host, outcome, said = start_on_free_port(lambda port: lab_host(tmp_path, port=port), docker_client, fake_image,
                                              container_name, gpu_nodes(tmp_path), memlock=-1)
    assert outcome.exit_code == 1 and outcome.diagnosis is not None
    assert outcome.diagnosis.key == "memlock_not_permitted" and "privileged" in said
    assert not docker_client.containers.list(all=True, filters={"name": container_name})


def test_forwarded_engine_is_probed_from_inside_the_container(docker_client: docker.DockerClient, fake_image: str,
                                                               container_name: str, tmp_path: Path) -> None:
    # A node's engine reached through an SSH-forwarded unix socket looks local, but the server's port
    # is published on the node, not here: readiness must be asked from inside the container. The
    # server's access log tells the two apart: inside, the probe comes from 127.0.0.1; from here it
    # would come through Docker's bridge.
    _host, outcome, said = start_on_free_port(lambda port: lab_host(tmp_path, port=port), docker_client, fake_image,
                                              container_name, gpu_nodes(tmp_path), timeout_s=60,
                                              engine_is_local=False)
    assert outcome.exit_code == 0, said
    log = docker_client.containers.get(container_name).logs().decode()
    probes = [line for line in log.splitlines() if "GET /health_generate" in line]
    assert probes and all(" 127.0.0.1:" in line for line in probes), probes


def test_foreign_container_with_the_servers_name_survives(docker_client: docker.DockerClient, fake_image: str,
                                                          container_name: str, tmp_path: Path) -> None:
    """Someone's own container under the server's name: not removed, not restarted; one line says so."""
    theirs = docker_client.containers.run(fake_image, ["sleep", "600"], name=container_name, detach=True,
                                          labels={"owner": "someone else"})
    with closed_port() as port:  # never published: the name clash stops the start first
        outcome, said = start(lab_host(tmp_path, port=port), fake_image, container_name, gpu_nodes(tmp_path))
    assert outcome.exit_code == 1
    text = " ".join(said.split())  # the test console wraps at 200 columns
    assert text.count("gpunode did not start") == 1 and f"named {container_name} (image {fake_image}, running)" in text
    assert "left alone" in text and f"docker rename {container_name} NEW-NAME" in text
    theirs.reload()
    assert theirs.status == "running" and theirs.id == docker_client.containers.get(container_name).id
