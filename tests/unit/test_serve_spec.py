"""container_spec: the server container as data, from the host file's plan, with no Docker call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode import derive, hostfile
from gpunode.hostfile import Host
from gpunode.catalogue import handoff
from gpunode.stages.serve import docker_run
from gpunode.derive import serverlaunch as launch
from gpunode.derive import serverspec as specs
from gpunode.stages.serve.command import build_spec, probe_address

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"
IMAGE = "gpunode/sglang:0.5.9-cu128-abcdef012345"
RUNTIME = handoff.GpuHandoff.runtime("all")


@pytest.fixture
def host() -> Host:
    return hostfile.load(EXAMPLE).hosts[0]


def with_server(host: Host, **changes: object) -> Host:
    return host.model_copy(update={"server": host.server.model_copy(update=changes)})


def test_spec_runs_the_plans_command_with_the_profile_env(host: Host) -> None:
    spec = build_spec(host, IMAGE, RUNTIME, with_api_key=False)
    launch = derive.server_launch(host)
    assert spec["image"] == IMAGE and spec["name"] == "gpunode-sglang" and spec["detach"] is True
    command = spec["command"]
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    # Every value inside its flag's own argument: a value beginning with "-" is never a flag.
    assert {"--model-path=/model", "--tp-size=8", "--port=30000"} <= set(command)
    assert not [a for a in command[3:] if a.startswith("-") is False]
    # Inside its own network namespace it listens everywhere; Docker publishes only the bind address.
    assert "--host=0.0.0.0" in command
    assert spec["ports"] == {"30000/tcp": ("127.0.0.1", 30000)}
    assert [a for a in command if a != "--host=0.0.0.0"] == [a for a in launch.argv if a != "--host=127.0.0.1"]
    assert spec["environment"] == {**launch.env, "FLASHINFER_WORKSPACE_BASE": "/var/cache/gpunode"}
    assert spec["environment"]["HF_HUB_OFFLINE"] == "1"


def test_spec_hands_gpus_shares_ipc_and_sizes_ulimits_for_nccl(host: Host) -> None:
    spec = build_spec(host, IMAGE, RUNTIME, with_api_key=False)
    assert spec["ipc_mode"] == "host" and "shm_size" not in spec
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in spec["ulimits"]}
    assert limits == {"memlock": (-1, -1), "stack": (64 * 1024 * 1024, 64 * 1024 * 1024)}
    assert spec["init"] is True
    assert spec["restart_policy"] == {"Name": "unless-stopped"}
    (request,) = spec["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    model, cache = spec["mounts"]
    assert (model["Source"], model["Target"], model["Type"], model["ReadOnly"]) == (
        "/models/GLM-5-NVFP4", "/model", "bind", True)
    # FlashInfer's JIT cache outlives the container: a named volume per server container.
    assert (cache["Source"], cache["Target"], cache["Type"], cache["ReadOnly"]) == (
        "gpunode-sglang-jit-cache", "/var/cache/gpunode", "volume", False)
    assert spec["log_config"]["Config"]["max-size"] == "100m"


def test_gpu_handoff_variants() -> None:
    chosen = handoff.GpuHandoff.runtime([0, 3]).docker_kwargs()["device_requests"][0]
    assert chosen["DeviceIDs"] == ["0", "3"] and chosen["Capabilities"] == [["gpu"]]
    nodes = handoff.GpuHandoff.device_nodes(["/var/lib/lab/dev/nvidia0", "/var/lib/lab/dev/nvidiactl",
                                           "/var/lib/lab/dev/nvidia-caps/nvidia-cap1"], "/var/lib/lab/dev")
    assert nodes.docker_kwargs() == {"devices": [
        "/var/lib/lab/dev/nvidia0:/dev/nvidia0:rwm", "/var/lib/lab/dev/nvidiactl:/dev/nvidiactl:rwm",
        "/var/lib/lab/dev/nvidia-caps/nvidia-cap1:/dev/nvidia-caps/nvidia-cap1:rwm"]}


def test_private_ipc_gets_a_sized_shm_and_on_failure_a_max() -> None:
    spec = specs.container_spec(image=IMAGE, argv=["python3", "-m", "x"], env={}, model_dir="/m", bind="127.0.0.1",
                                port=1, gpus=RUNTIME, ipc_mode="private",
                                restart=specs.RestartPolicy("on-failure", 3))
    assert spec["shm_size"] == "32g" and spec["ipc_mode"] == "private"
    assert spec["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 3}


def test_api_key_goes_through_a_key_file_and_the_launcher_never_the_spec(host: Host,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_KEY", "s3cret-value")
    exposed = with_server(host, bind="0.0.0.0", api_key=hostfile.SecretRef(env="SGLANG_KEY"))
    spec = build_spec(exposed, IMAGE, RUNTIME, with_api_key=True)
    assert "s3cret-value" not in json.dumps(spec, default=str)
    command = spec["command"]
    assert not [a for a in command if a.startswith("--api-key")]  # the plan's placeholder is dropped too
    path, content = specs.launcher()
    assert command[:3] == ["python3", path, "sglang.launch_server"]
    assert path.startswith("/run/gpunode/") and content == Path(launch.__file__).read_bytes()
    assert spec["ports"] == {"30000/tcp": ("0.0.0.0", 30000)}
    assert json.loads(specs.api_key_file_content("s3cret-value")) == {"api-key": "s3cret-value"}
    # Without a key the server runs its module as the plan says, and there is no launcher.
    plain = build_spec(host, IMAGE, RUNTIME, with_api_key=False)["command"]
    assert plain[:3] == ["python3", "-m", "sglang.launch_server"]


@pytest.mark.parametrize("key", ["-starts-with-a-dash", "--api-key", "-", "a b\"c'd", "k=v=w"])
def test_the_launcher_hands_any_key_to_sglangs_parser_as_one_argument(key: str) -> None:
    """A key that begins with '-' as sglang's own parser reads it (the stand-in rebuilds that parser
    from the data dumped from sglang 0.5.9 and 0.5.23): the value, not an error or a flag."""
    from gpunode_lab.standin import sglang_server

    argv = launch.launch_argv("sglang.launch_server", ["--model-path=/model", "--tp-size=8"], key)
    assert argv[0] == "sglang.launch_server" and argv[-1] == "--api-key=" + key
    for version in ("0.5.9", "0.5.23"):
        parser = sglang_server.real_parser(version)
        assert parser.parse_args(argv[1:]).api_key == key
        # Two arguments, as sglang's --config reader makes them, fail for a key beginning with "-"
        # (argparse takes a lone "-" for a value).
        if key.startswith("-") and key != "-":
            with pytest.raises(SystemExit):
                parser.parse_args(["--model-path=/model", "--api-key", key])


def test_the_launcher_refuses_a_key_on_the_command_line() -> None:
    for given in (["--api-key", "x"], ["--api-key=x"]):
        with pytest.raises(SystemExit, match="never the command line"):
            launch.launch_argv("sglang.launch_server", given, "k")


def test_the_launcher_runs_the_module_as_python_m_does(tmp_path: Path) -> None:
    """The real file, run as the container runs it: the module sees its arguments and the key."""
    import subprocess
    import sys

    (tmp_path / "fake_entry.py").write_text("import sys\nprint(repr(sys.argv[1:]), __name__)\n")
    key_file = tmp_path / "key.json"
    key_file.write_bytes(specs.api_key_file_content("-dash-key"))
    code = (f"import runpy, sys; sys.path.insert(0, {str(tmp_path)!r}); "
            f"import gpunode.derive.serverlaunch as l; l.KEY_FILE = {str(key_file)!r}; "
            "sys.argv = ['launch.py', 'fake_entry', '--tp-size=8']; l.main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--tp-size=8', '--api-key=-dash-key'] __main__"


def test_same_settings_same_hash_changed_settings_new_hash(host: Host) -> None:
    first = build_spec(host, IMAGE, RUNTIME, with_api_key=False)
    again = build_spec(host, IMAGE, RUNTIME, with_api_key=False)
    assert first["labels"][specs.LABEL_HASH] == again["labels"][specs.LABEL_HASH]
    assert first["labels"][specs.LABEL_ROLE] == "sglang-server"
    variants = [
        build_spec(host, IMAGE.replace("abcdef", "fedcba"), RUNTIME, with_api_key=False),
        build_spec(with_server(host, flags={"--max-running-requests": 512}), IMAGE, RUNTIME, with_api_key=False),
        build_spec(with_server(host, env={"NCCL_DEBUG": "INFO"}), IMAGE, RUNTIME, with_api_key=False),
        build_spec(with_server(host, port=30001), IMAGE, RUNTIME, with_api_key=False),
        build_spec(host, IMAGE, handoff.GpuHandoff.runtime([0, 1]), with_api_key=False),
    ]
    hashes = {v["labels"][specs.LABEL_HASH] for v in variants} | {first["labels"][specs.LABEL_HASH]}
    assert len(hashes) == len(variants) + 1


def test_probe_address() -> None:
    assert probe_address("127.0.0.1") == "127.0.0.1"
    assert probe_address("0.0.0.0") == "127.0.0.1"
    assert probe_address("::") == "[::1]"
    assert probe_address("10.0.3.10") == "10.0.3.10"


def make_nodes(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def test_gpu_handoff_nvidia_runtime_only_when_the_host_file_picks_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff.shutil, "which", lambda _name: None)
    info = {"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}}
    picked = handoff.choose(info, [0, 1], local=True, configured="nvidia-runtime", dev_root=tmp_path)
    assert picked.kind == "runtime" and picked.device_ids == ("0", "1")
    assert handoff.choose(info, "all", local=False, configured="nvidia-runtime").device_ids == ()
    with pytest.raises(handoff.HandoffError, match="nvidia-container-toolkit"):
        handoff.choose({"Runtimes": {"runc": {}}}, "all", local=False, configured="nvidia-runtime")
    # host-driver never takes NVIDIA's runtime, even where Docker has it.
    assert handoff.choose({**info, "CDISpecDirs": ["/etc/cdi"]}, "all", local=False).kind == "cdi"


CDI_SPEC = {"cdiVersion": "0.5.0", "kind": "gpunode.io/gpu",
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
                        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
                        {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"},
                                                                           {"path": "/dev/nvidia1"}]}}],
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
                               "mounts": [{"hostPath": "/usr/local/nvidia/lib64/libcuda.so.1",
                                           "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1",
                                           "options": ["ro", "nosuid", "nodev", "bind"]},
                                          {"hostPath": "/usr/local/nvidia/bin/nvidia-smi",
                                           "containerPath": "/usr/local/nvidia/bin/nvidia-smi",
                                           "options": ["ro", "nosuid", "nodev", "bind"]}]}}


def test_gpu_handoff_through_docker_cdi_names_the_spec_devices() -> None:
    picked = handoff.choose({"CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}, [1], local=False)
    (request,) = picked.docker_kwargs()["device_requests"]
    assert request["Driver"] == "cdi" and request["DeviceIDs"] == ["gpunode.io/gpu=1"]
    assert handoff.GpuHandoff.cdi("all").device_ids == ("gpunode.io/gpu=all",)
    assert picked.mounts() == []


def test_gpu_handoff_without_docker_cdi_is_the_same_list_by_hand() -> None:
    picked = handoff.choose({"CDISpecDirs": None}, [1], local=False, cdi_spec=CDI_SPEC)
    assert picked.kind == "devices"
    assert picked.docker_kwargs() == {"devices": ["/dev/nvidia1:/dev/nvidia1:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm",
                                                  "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm"]}
    mounts = picked.run_kwargs()["mounts"]
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in mounts] == [
        ("/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", True),
        ("/usr/local/nvidia/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi", True)]
    every = handoff.choose({}, "all", local=False, cdi_spec=CDI_SPEC)
    assert [inside for _o, inside in every.nodes][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    spec = specs.container_spec(image=IMAGE, argv=["python3"], env={}, model_dir="/m", bind="127.0.0.1", port=1,
                                gpus=picked)
    assert [m["Target"] for m in spec["mounts"]] == ["/model", "/var/cache/gpunode", "/usr/local/nvidia/lib64/libcuda.so.1",
                                                    "/usr/local/nvidia/bin/nvidia-smi"]
    with pytest.raises(handoff.HandoffError, match="no device 5"):
        handoff.choose({}, [5], local=False, cdi_spec=CDI_SPEC)
    with pytest.raises(handoff.HandoffError, match="no CDI spec"):
        handoff.choose({}, "all", local=False)


def test_the_handoff_as_docker_run_arguments_is_the_same_list() -> None:
    """The node stage's probes and the checks start containers with these; serve with the SDK kwargs."""
    by_hand = handoff.choose({}, [1], local=False, cdi_spec=CDI_SPEC)
    assert by_hand.cli_args() == [
        "--device=/dev/nvidia1:/dev/nvidia1:rwm", "--device=/dev/nvidiactl:/dev/nvidiactl:rwm",
        "--device=/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
        "--volume=/usr/local/nvidia/lib64/libcuda.so.1:/usr/local/nvidia/lib64/libcuda.so.1:ro",
        "--volume=/usr/local/nvidia/bin/nvidia-smi:/usr/local/nvidia/bin/nvidia-smi:ro"]
    assert [f"--device={d}" for d in by_hand.docker_kwargs()["devices"]] == by_hand.cli_args()[:3]
    cdi = handoff.choose({"CDISpecDirs": ["/etc/cdi"]}, "all", local=False, cdi_spec=CDI_SPEC)
    assert cdi.cli_args() == ["--device=gpunode.io/gpu=all"]
    assert handoff.GpuHandoff.runtime([0, 3]).cli_args() == ["--gpus", "device=0,3"]
    assert handoff.GpuHandoff.runtime("all").cli_args() == ["--gpus", "all"]


def test_gpu_handoff_falls_back_to_device_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "CDI_SPEC_FILE", str(tmp_path / "no-such-spec.json"))
    make_nodes(tmp_path, ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
    picked = handoff.choose({"Runtimes": {"runc": {}}}, [0, 2], local=True, dev_root=tmp_path)
    assert [inside for _outside, inside in picked.nodes] == [
        "/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    every = handoff.choose({}, "all", local=True, dev_root=tmp_path)
    assert sum(inside[len("/dev/nvidia"):].isdigit() for _o, inside in every.nodes) == 3
    with pytest.raises(handoff.HandoffError, match="nvidia5"):
        handoff.choose({}, [5], local=True, dev_root=tmp_path)
