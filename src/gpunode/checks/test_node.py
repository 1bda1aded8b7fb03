"""Layer node: the GPU container's OS, device nodes, Docker, the GPU hand-off, user space."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpunode.catalogue import handoff
from gpunode.checks.conftest import unit_log_tail
from gpunode.stages.node.userspace import installed_versions, module_version
from gpunode.ground.nvidia import CDI_SPEC_FILE, CONTROL_NODES, GPU_MAJOR, MOUNT_POINT
FIX_CONTAINER = "run `gpunode provision --tags container` (devN changes need --restart-container)"
FIX_NODE = "run `gpunode provision --tags node`"


def test_debian_12_with_systemd(gpu_node: Any) -> None:
    assert gpu_node.system_info.distribution == "debian" and gpu_node.system_info.release.startswith("12"), \
        f"{gpu_node.system_info.distribution} {gpu_node.system_info.release}: recreate from a debian-12 template"
    assert gpu_node.file("/proc/1/comm").content_string.strip() == "systemd"


def _selected(gpunode_host: dict[str, Any], devices: dict[str, Any]) -> list[str]:
    gpus = gpunode_host["container"]["gpus"]
    return devices["gpus"] if gpus == "all" else [f"/dev/nvidia{minor}" for minor in gpus]


def test_gpu_nodes_present(gpu_node: Any, gpunode_host: dict[str, Any], node_devices: dict[str, Any]) -> None:
    wrong = []
    for path in _selected(gpunode_host, node_devices):
        entry = node_devices["devices"].get(path)
        if not entry or not entry["char"] or (entry["major"], entry["minor"]) != (GPU_MAJOR, int(path[11:])):
            wrong.append(path)
    assert not wrong, f"missing or wrong inside the container: {', '.join(wrong)} -> {FIX_CONTAINER}"


@pytest.mark.parametrize("path", CONTROL_NODES)
def test_control_node_present(path: str, gpu_node: Any, node_devices: dict[str, Any]) -> None:
    entry = node_devices["devices"].get(path)
    assert entry and entry["char"], f"{path} missing inside the container -> {FIX_CONTAINER}"


def test_nodes_open_without_eperm(gpu_node: Any, node_devices: dict[str, Any]) -> None:
    denied = [p for p, e in node_devices["devices"].items() if e["open_error"] in ("EPERM", "EACCES")]
    assert not denied, f"the container's cgroup denies {', '.join(denied)} -> {FIX_CONTAINER}"


def test_docker_running(gpu_node: Any) -> None:
    assert gpu_node.service("docker").is_running, \
        f"Docker is not running; last journal lines: {unit_log_tail(gpu_node, 'docker')} -> run `gpunode provision --tags node`"


DRIVER_MOUNT = MOUNT_POINT
CDI_SPEC = CDI_SPEC_FILE
FIX_RESTART = "restart the container so it mounts the host's current tree: `gpunode provision --restart-container`"


def _handoff_args(gpu_node: Any, gpunode_host: dict[str, Any]) -> str:
    """docker run arguments as the node stage and serve hand the GPUs over (gpunode.catalogue.handoff.choose,
    from the node's Docker and its CDI spec)."""
    configured = gpunode_host["container"]["gpu_handoff"]
    info = gpu_node.run("docker info --format '{{json .}}'")
    if info.rc != 0:
        pytest.fail(f"docker info failed on the node: {info.stderr.strip()} -> {FIX_NODE}")
    spec = gpu_node.file(CDI_SPEC)
    if configured == "host-driver" and not spec.exists:
        pytest.fail(f"{CDI_SPEC} missing: the node stage writes it from the host's driver tree -> {FIX_NODE}")
    try:
        chosen = handoff.choose(json.loads(info.stdout), gpunode_host["container"]["gpus"], local=False,
                                configured=configured, cdi_spec=json.loads(spec.content_string) if spec.exists else None)
    except handoff.HandoffError as exc:
        pytest.fail(f"{exc}")
    return " ".join(chosen.cli_args() + [f"-e LD_LIBRARY_PATH={DRIVER_MOUNT}/lib64"])


def test_gpu_handoff_to_docker(gpu_node: Any, gpunode_host: dict[str, Any], node_devices: dict[str, Any]) -> None:
    if not gpu_node.service("docker").is_running:
        pytest.fail("Docker is not running: run `gpunode provision --tags node`")
    args = _handoff_args(gpu_node, gpunode_host)
    script = ("import os, json; print(json.dumps({'/dev/' + n: [os.major(os.stat('/dev/' + n).st_rdev), "
              "os.minor(os.stat('/dev/' + n).st_rdev)] for n in os.listdir('/dev') if n.startswith('nvidia')}))")
    result = gpu_node.run(f"docker run --rm {args} gpunode/probe:bookworm-1 python3 -c \"{script}\"")
    assert result.rc == 0, f"a container with the GPU hand-off did not start: {result.stderr.strip()} -> " \
                           "run `gpunode provision --tags node`"
    seen = json.loads(result.stdout)
    want = {p: [e["major"], e["minor"]] for p, e in node_devices["devices"].items() if e["char"]}
    assert seen == want, f"a container sees {seen}, the LXC has {want} -> run `gpunode provision --tags node`"


def _tree(gpu_node: Any, gpunode_host: dict[str, Any]) -> dict[str, Any]:
    if gpunode_host["container"]["gpu_handoff"] != "host-driver":
        pytest.skip("nvidia-runtime hand-off: the user space is installed in the container, not mounted")
    manifest = gpu_node.file(f"{DRIVER_MOUNT}/gpunode-tree.json")
    if not manifest.exists:
        pytest.fail(f"{DRIVER_MOUNT} holds no driver tree: the container stage mounts the host's tree there -> "
                    "run `gpunode provision --tags host,container` (a changed mount point needs --restart-container)")
    return dict(json.loads(manifest.content_string))


def test_driver_tree_is_the_host_modules(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    tree = _tree(gpu_node, gpunode_host)
    banner = gpu_node.file("/proc/driver/nvidia/version")
    module = module_version(banner.content_string) if banner.exists else ""
    if not module and not gpunode_host["lab"]:
        pytest.fail("no NVIDIA kernel module visible: load the driver on the host (`gpunode provision --tags host`)")
    host = module or gpunode_host["driver"]["version"]  # the lab has no module: the pin stands in
    assert tree["version"] == host, \
        f"{DRIVER_MOUNT} holds user space {tree['version']}, the host's module is {host} (a stale mount after a " \
        f"host driver upgrade) -> {FIX_RESTART}"


def test_server_containers_find_libcuda_and_nvidia_smi(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    _tree(gpu_node, gpunode_host)
    args = _handoff_args(gpu_node, gpunode_host)
    result = gpu_node.run(f"docker run --rm {args} gpunode/probe:bookworm-1 sh -c "
                          f"'test -f {DRIVER_MOUNT}/lib64/libcuda.so.1 && {DRIVER_MOUNT}/bin/nvidia-smi'")
    assert result.rc == 0 and "Driver Version" in result.stdout, \
        f"a container with the hand-off cannot find libcuda.so.1 or run nvidia-smi from {DRIVER_MOUNT} " \
        f"(exit {result.rc}: {(result.stderr or result.stdout).strip()[-300:]}) -> {FIX_NODE}"


TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
NO_CGROUPS = re.compile(r"^\s*no-cgroups\s*=\s*true\s*(#.*)?$", re.MULTILINE)


def _toolkit_node(gpu_node: Any, gpunode_host: dict[str, Any]) -> Any:
    if gpunode_host["container"]["gpu_handoff"] != "nvidia-runtime":
        pytest.skip("host-driver hand-off: the NVIDIA container toolkit is not used on this node")
    return gpu_node


def test_toolkit_leaves_cgroups_to_lxc(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    # In an LXC container the device rules are Proxmox's (devN); a runtime writing its own fails.
    config = _toolkit_node(gpu_node, gpunode_host).file(TOOLKIT_CONFIG)
    assert config.exists, f"{TOOLKIT_CONFIG} missing: the toolkit is not installed -> {FIX_NODE}"
    assert NO_CGROUPS.search(config.content_string), \
        f"{TOOLKIT_CONFIG} lacks 'no-cgroups = true' (edited by hand?): containers fail to start in LXC -> {FIX_NODE}"


def test_docker_knows_the_nvidia_runtime(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    daemon = _toolkit_node(gpu_node, gpunode_host).file("/etc/docker/daemon.json")
    runtimes = json.loads(daemon.content_string).get("runtimes", {}) if daemon.exists else {}
    assert "nvidia" in runtimes, f"/etc/docker/daemon.json has no nvidia runtime ({sorted(runtimes)}) -> {FIX_NODE}"


def test_userspace_matches_host_module(gpu_node: Any, gpunode_host: dict[str, Any]) -> None:
    if gpunode_host["container"]["gpu_handoff"] != "nvidia-runtime":
        pytest.skip("host-driver hand-off: no user space is installed in the container (see the driver tree checks)")
    banner = gpu_node.file("/proc/driver/nvidia/version")
    if not banner.exists:
        if gpunode_host["lab"]:
            pytest.skip("lab: no NVIDIA kernel module visible, so there is no user space to match")
        pytest.fail("no NVIDIA kernel module visible: load the driver on the host (`gpunode provision --tags host`)")
    module = module_version(banner.content_string)
    libs = gpu_node.run("ls /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib 2>/dev/null").stdout.split()
    installed = installed_versions(libs)
    assert installed == [module], f"user space {installed or 'none'} != host module {module}: " \
                                  "run `gpunode provision --tags node`"


def test_node_record_matches(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    record = gpu_node.file("/etc/gpunode/node.json")
    assert record.exists, "/etc/gpunode/node.json missing: run `gpunode provision --tags node`"
    data = json.loads(record.content_string)
    assert data["expected"]["image_tag"] == gpunode_derived["image_tag"], \
        f"the node records image {data['expected']['image_tag']}, the host file means {gpunode_derived['image_tag']}: " \
        "run `gpunode provision`"
