"""plan: the container config, devN lines, server command line and stages, from the host file alone."""

from __future__ import annotations

import json
import shlex
import socket
from pathlib import Path

import pytest
import yaml

from gpunode import derive, hostfile

from gpunode.derive import plan

from gpunode.catalogue import profiles

from gpunode.ground import stagelist as stages
from gpunode.ground.paths import PLAYBOOKS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"


@pytest.fixture
def example() -> hostfile.HostFile:
    return hostfile.load(EXAMPLE)


def test_container_config_has_every_devn_line(example: hostfile.HostFile) -> None:
    config = derive.container_config(example.hosts[0].container, example.hosts[0].name)
    gpu_lines = [config[f"dev{i}"] for i in range(8)]
    assert gpu_lines == [f"/dev/nvidia{i},mode=0666" for i in range(8)]
    assert [config["dev8"], config["dev9"], config["dev10"], config["dev11"]] == [
        "/dev/nvidiactl,mode=0666", "/dev/nvidia-uvm,mode=0666", "/dev/nvidia-uvm-tools,mode=0666",
        "/dev/nvidia-modeset,mode=0666",
    ]
    assert "dev12" not in config
    assert config["features"] == "nesting=1,keyctl=1"
    assert config["memory"] == 512 * 1024 and config["swap"] == 0
    assert config["rootfs"] == "local-lvm:200"
    assert config["net0"] == "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1"


def test_gpu_subset_and_mig(example: hostfile.HostFile) -> None:
    container = example.hosts[0].container.model_copy(update={"gpus": [2, 5], "mig": True})
    entries = derive.dev_entries(container)
    assert [e.path for e in entries] == ["/dev/nvidia2", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                         "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps/<each>"]
    everything = derive.dev_entries(example.hosts[0].container.model_copy(update={"gpus": "all"}))
    assert everything[0].when == "one per /dev/nvidiaN found on the host"


def test_server_command_passes_the_profile_and_overrides(example: hostfile.HostFile) -> None:
    host = example.hosts[0]
    argv = list(derive.server_launch(host).argv)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    pairs = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    assert pairs["--tp-size"] == "8" and pairs["--kv-cache-dtype"] == "bf16"
    assert pairs["--fp4-gemm-backend"] == "flashinfer_cudnn" and pairs["--max-running-requests"] == "1024"
    assert pairs["--nsa-decode-backend"] == pairs["--nsa-prefill-backend"] == "trtllm"
    assert not [a for a in argv if a.startswith("--tp=")] and "--disable-radix-cache" in argv
    assert pairs["--model-path"] == "/model" and pairs["--served-model-name"] == "glm-5"
    assert "--enable-metrics" in argv  # the monitor stage and a roll's drain read them
    overridden = host.model_copy(update={"server": host.server.model_copy(update={
        "flags": {"--max-running-requests": 512, "--disable-radix-cache": False,
                  "--enable-metrics-for-all-schedulers": True},
        "env": {"NCCL_DEBUG": "INFO"}})})
    launch = derive.server_launch(overridden)
    pairs = dict(arg.split("=", 1) for arg in launch.argv if "=" in arg)
    assert pairs["--max-running-requests"] == "512"
    assert "--disable-radix-cache" not in launch.argv and launch.argv[-1] == "--enable-metrics-for-all-schedulers"
    assert launch.env["NCCL_DEBUG"] == "INFO" and launch.env["NCCL_P2P_LEVEL"] == "PHB"
    assert launch.reasons["--max-running-requests"] == "set in the host file (server.flags)"


def test_api_key_never_in_plan(example: hostfile.HostFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM_API_KEY", "sk-very-secret")
    host = example.hosts[0]
    exposed = host.model_copy(update={"server": host.server.model_copy(update={
        "bind": "0.0.0.0", "api_key": hostfile.SecretRef(env="GLM_API_KEY")})})
    rendered = json.dumps(plan.plan_host(exposed).server)
    assert "sk-very-secret" not in rendered and "--api-key=***" in rendered


def test_every_profile_flag_has_a_reason() -> None:
    for name in profiles.available():
        profile = profiles.load(name)
        assert profile.flags and all(flag.why.strip() for flag in profile.flags)
        assert all(var.why.strip() for var in profile.env)
        assert len({flag.flag for flag in profile.flags}) == len(profile.flags)


def test_command_line_is_shell_safe(example: hostfile.HostFile) -> None:
    launch = derive.server_launch(example.hosts[0])
    assert shlex.split(launch.command_line()) == list(launch.argv)


def test_image_tag_follows_content(example: hostfile.HostFile) -> None:
    host = example.hosts[0]
    tag = derive.image_tag(host)
    assert tag.startswith("gpunode/sglang:0.5.9-cu128-") and tag == derive.image_tag(host)
    image = host.image
    other = image.model_copy(update={"pins": image.pins.model_copy(update={"flashinfer": "0.6.4"})})
    assert derive.image_tag(host.model_copy(update={"image": other})) != tag
    # The modules built ahead of time are part of the image: another FP4 GEMM backend, another tag.
    cutlass = host.server.model_copy(update={"flags": {"--fp4-gemm-backend": "flashinfer_cutlass"}})
    assert derive.image_tag(host.model_copy(update={"server": cutlass})) != tag


def test_token_auth_warns_about_devn(example: hostfile.HostFile) -> None:
    host = example.hosts[0]
    token = hostfile.ApiAuth(method="token", token_id="gpunode", token_secret=hostfile.SecretRef(env="T"))
    warned = plan.plan_host(host.model_copy(update={"api": host.api.model_copy(update={"auth": token})}))
    assert any("root@pam only" in w and "password" in w and "local" in w for w in warned.warnings)


def test_plan_contacts_nothing(gpunode, monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process: any socket use would raise.
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("plan opened a socket")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    plans = plan.make_plan(hostfile.load(EXAMPLE))
    assert plans[0].container["vmid"] == 200
    result = gpunode("plan", str(EXAMPLE), "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    # Each host's stages; the router's is the fleet's, shown with the router when the file has one.
    assert [s["name"] for s in data["hosts"][0]["stages"]] == [n for n in stages.STAGE_NAMES if n not in ("router", "monitor")]
    assert data["router"] is None
    human = gpunode("plan", str(EXAMPLE))
    for needle in ("dev7: /dev/nvidia7,mode=0666", "uvm_disable_hmm=1", "gpunode/sglang:0.5.9-cu128-",
                   "--moe-runner-backend flashinfer_cutlass", "NCCL_P2P_LEVEL=PHB", "stages and checks"):
        assert needle in human.stdout
    assert not (Path(human.args[0]).parent / "state").exists()


@pytest.mark.parametrize("tags,start,expected", [
    (None, None, list(stages.STAGE_NAMES)),
    (None, "node", ["node", "model", "image", "p2p", "serve", "smoke", "router", "monitor"]),
    (["node", "smoke"], None, ["node", "smoke"]),
    (["host", "serve"], "node", ["serve"]),
])
def test_stage_selection(tags: list[str] | None, start: str | None, expected: list[str]) -> None:
    assert stages.select(tags, start) == expected


def test_stage_selection_errors() -> None:
    with pytest.raises(ValueError, match="unknown stage 'hots'"):
        stages.select(["hots"], None)
    with pytest.raises(ValueError, match="select no stage"):
        stages.select(["host"], "node")


def test_each_stage_is_one_tagged_play() -> None:
    import yaml

    provision = yaml.safe_load((PLAYBOOKS / "provision.yml").read_text())
    imported = [entry["ansible.builtin.import_playbook"] for entry in provision]
    assert imported == [f"stages/{name}.yml" for name in stages.STAGE_NAMES]
    for name in stages.STAGE_NAMES:
        plays = yaml.safe_load((PLAYBOOKS / "stages" / f"{name}.yml").read_text())
        assert len(plays) == 1 and plays[0]["tags"] == [name]


def test_lab_stand_in_is_planned_plainly(tmp_path: Path) -> None:
    from gpunode_lab.image import FAKE_REPO, fake_tag

    lab = hostfile.load(ROOT / "inventory" / "lab" / "host.yml").hosts[0]
    built = plan.plan_host(lab)
    assert built.image["lab_stand_in"] == "fake-sglang"
    assert built.image["server_image"] == fake_tag() and fake_tag().startswith(FAKE_REPO + ":")
    assert built.image["tag"] == derive.image_tag(lab), "the real image's tag is still planned"
    real = lab.model_copy(update={"image": lab.image.model_copy(update={"lab_stand_in": None})})
    assert derive.server_image(real) == derive.image_tag(real)


def test_lab_leaves_out_fewer_stages_with_a_stand_in() -> None:
    assert set(stages.lab_leaves_out(False)) == {"image", "p2p", "serve", "smoke", "router", "monitor"}
    assert set(stages.lab_leaves_out(True)) == {"p2p"}, "the fake server cannot measure P2P"
    assert "no GPU" in stages.lab_leaves_out(True)["p2p"]


def test_the_plan_names_what_the_node_stage_installs_as_the_role_installs_it(example: hostfile.HostFile) -> None:
    # plan says it before the node stage acts; the role's own defaults and its one apt task decide it.
    from gpunode.ground.paths import COLLECTION

    role = COLLECTION / "roles" / "node"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    install = yaml.safe_load((role / "tasks" / "install.yml").read_text())
    apt = next(task for task in install if "ansible.builtin.apt" in task)["ansible.builtin.apt"]["name"]
    assert apt == "{{ node_base_packages + node_docker_packages + ['debootstrap'] }}", "the apt task changed: update plan"
    assert list(plan.NODE_PACKAGES) == defaults["node_base_packages"] + defaults["node_docker_packages"] + ["debootstrap"]
    assert (plan.NODE_STATE_DIR, plan.PROBE_IMAGE) == (defaults["node_state_dir"], defaults["node_probe_image"])
    planned = plan.plan_host(example.hosts[0], example)
    assert "python3-apt" in planned.node_changes[0] and "/etc/cdi/gpunode.json" in planned.node_changes[1]
    # The host stage's own python3-apt (with the headers) and the model tools' are said too.
    assert any("python3-apt" in change for change in planned.host_changes)
    assert "python3-apt" in planned.model["tools"]


def test_the_printed_plan_lists_the_node_changes(gpunode) -> None:
    human = gpunode("plan", str(EXAMPLE))
    assert human.returncode == 0, human.stderr
    text = " ".join(human.stdout.split())
    assert "Node changes (inside the container)" in text
    assert f"Debian's {', '.join(plan.NODE_PACKAGES)} installed if missing" in text
