"""The node stage inside the lab's GPU container: Docker Engine, the GPU hand-off, the probes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gpunode_lab as lab

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"
NODE = "pve-lab-ct200"


def in_node(*remote: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(*remote), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def provision(gpunode, *args: str, hosts: Path = LAB_HOSTS) -> tuple[int, dict, str]:
    result = gpunode("provision", str(hosts), "--tags", "node", "--json", *args, timeout=900)
    return result.returncode, json.loads(result.stdout), result.stderr


def test_docker_runs_inside_and_the_handoff_shows_every_node(gpunode) -> None:
    rc, first, stderr = provision(gpunode)
    assert rc == 0, stderr
    assert in_node("docker", "info", "--format", "{{.ServerVersion}}").stdout.strip().startswith("20.10")
    assert "ok      pve-lab-ct200  Assert the container sees every NVIDIA node of the LXC, with its major:minor" in stderr
    # Independently of the role: a container started with the same hand-off, listing /dev.
    devices = " ".join(f"--device=/dev/{name}" for name in lab.device_nodes())
    script = ("import os, json; print(json.dumps({n: [os.major(os.stat('/dev/' + n).st_rdev), "
              "os.minor(os.stat('/dev/' + n).st_rdev)] for n in os.listdir('/dev') if n.startswith('nvidia')}))")
    seen = json.loads(in_node(f"docker run --rm {devices} gpunode/probe:bookworm-1 python3 -c \"{script}\"").stdout)
    expected = {name: list(numbers) for name, numbers in lab.device_nodes().items()}
    assert seen == expected
    assert_host_driver_tree_mounted_read_only_and_on_the_loader_path()
    # Idempotent: the second run changes nothing (runner stats).
    rc, second, _ = provision(gpunode)
    assert rc == 0 and not second["stats"].get("changed"), second["stats"]


def test_lab_says_why_user_space_and_cuda_probe_are_not_run(gpunode) -> None:
    rc, _, stderr = provision(gpunode)
    assert rc == 0
    assert "no NVIDIA kernel module is visible in pve-lab-ct200" in stderr
    assert "CUDA probe not run on pve-lab-ct200: no NVIDIA kernel module visible" in stderr


def test_repairs_a_stopped_docker(gpunode) -> None:
    in_node("systemctl", "stop", "docker", "docker.socket")
    rc, result, _ = provision(gpunode)
    assert rc == 0 and result["stats"]["changed"][NODE] >= 1
    assert in_node("systemctl", "is-active", "docker").stdout.strip() == "active"


def test_toolkit_path_reports_an_unreachable_repository_clearly(gpunode, tmp_path: Path) -> None:
    # NVIDIA's repository is not reachable from this sandbox: the toolkit path cannot be run here;
    # what it must do is stop with the host, the task and the cause.
    hosts = tmp_path / "host.yml"
    text = LAB_HOSTS.read_text()
    assert "      gpus: [0, 1]\n" in text
    hosts.write_text(text.replace("      gpus: [0, 1]\n", "      gpus: [0, 1]\n      gpu_handoff: nvidia-runtime\n"))
    rc, summary, _ = provision(gpunode, "--check", hosts=hosts)
    assert rc == 1
    failure = summary["failures"][0]
    assert failure["host"] == NODE and failure["task"] == "Add NVIDIA's container toolkit signing key"
    assert "Request failed" in failure["message"]


def assert_host_driver_tree_mounted_read_only_and_on_the_loader_path() -> None:
    mount = in_node("findmnt", "-no", "OPTIONS,SOURCE", "/usr/local/nvidia").stdout
    assert mount.split(",")[0] == "ro" and "/var/lib/gpunode/nvidia/580.159.04" in mount, mount
    assert in_node("touch", "/usr/local/nvidia/lib64/x").returncode != 0, "the mounted tree must be read-only"
    assert "/usr/local/nvidia/lib64" in in_node("cat", "/etc/ld.so.conf.d/gpunode-nvidia.conf").stdout
    assert "Driver Version: 580.159.04" in in_node("bash", "-lc", "nvidia-smi").stdout  # PATH for login shells
    spec = json.loads(in_node("cat", "/etc/cdi/gpunode.json").stdout)
    mounted = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert {"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
            "/usr/local/nvidia/bin/nvidia-smi"} <= mounted
    assert not in_node("test", "-e", "/etc/nvidia-container-runtime/config.toml").returncode == 0, \
        "the host-driver hand-off installs nothing from NVIDIA"


def test_stale_driver_mount_is_named_with_its_fix(gpunode, tmp_path: Path) -> None:
    # The host file pins a driver the mounted tree is not (the lab has no module: the pin stands in).
    hosts = tmp_path / "host.yml"
    hosts.write_text(LAB_HOSTS.read_text().replace('version: "580.159.04"', 'version: "580.172.08"'))
    rc, summary, _ = provision(gpunode, hosts=hosts)
    assert rc == 1
    failure = summary["failures"][0]
    assert failure["host"] == NODE and failure["task"] == "Assert the mounted user space is the host module's version"
    assert "mounts NVIDIA user space 580.159.04, but the host's module is 580.172.08" in failure["message"]
    assert "--restart-container" in failure["message"]
