"""The node layer's toolkit checks, run through testinfra against a real container holding the
files as the node role writes them, then as a hand edit leaves them. The lab node cannot show this:
it uses the host-driver hand-off, and NVIDIA's toolkit cannot be downloaded here."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import testinfra

from gpunode.checks import test_node as node_layer

# The inventory's gpunode_host, as far as these checks read it.
RUNTIME = {"container": {"gpu_handoff": "nvidia-runtime"}}
# Shaped like nvidia-container-toolkit 1.17's default config, after the node role's lineinfile.
TOOLKIT_CONFIG = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true
no-cgroups = true
"""
DAEMON_JSON = '{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}'


@pytest.fixture
def node(docker_client: docker.DockerClient, fake_image: str, container_name: str) -> Iterator[Any]:
    docker_client.containers.run(fake_image, ["sleep", "600"], name=container_name, detach=True)
    yield testinfra.get_host(f"docker://{container_name}")


def put(node: Any, path: str, text: str) -> None:
    folder = path.rsplit("/", 1)[0]
    node.check_output(f"mkdir -p {folder} && printf %s {shlex.quote(text)} > {path}")


def test_toolkit_config_as_written_passes_and_a_hand_edit_is_named(node: Any) -> None:
    put(node, node_layer.TOOLKIT_CONFIG, TOOLKIT_CONFIG)
    node_layer.test_toolkit_leaves_cgroups_to_lxc(node, RUNTIME)
    for edited in (TOOLKIT_CONFIG.replace("no-cgroups = true", "no-cgroups = false"),
                   TOOLKIT_CONFIG.replace("no-cgroups = true", "#no-cgroups = true")):
        put(node, node_layer.TOOLKIT_CONFIG, edited)
        with pytest.raises(AssertionError, match=r"lacks 'no-cgroups = true' \(edited by hand\?\).*--tags node"):
            node_layer.test_toolkit_leaves_cgroups_to_lxc(node, RUNTIME)
    node.check_output(f"rm {node_layer.TOOLKIT_CONFIG}")
    with pytest.raises(AssertionError, match="missing: the toolkit is not installed"):
        node_layer.test_toolkit_leaves_cgroups_to_lxc(node, RUNTIME)


def test_docker_without_the_nvidia_runtime_is_named(node: Any) -> None:
    put(node, "/etc/docker/daemon.json", DAEMON_JSON)
    node_layer.test_docker_knows_the_nvidia_runtime(node, RUNTIME)
    put(node, "/etc/docker/daemon.json", '{"runtimes": {}, "log-driver": "json-file"}')
    with pytest.raises(AssertionError, match=r"has no nvidia runtime \(\[\]\)"):
        node_layer.test_docker_knows_the_nvidia_runtime(node, RUNTIME)


def test_host_driver_handoff_says_the_toolkit_does_not_apply(node: Any) -> None:
    with pytest.raises(pytest.skip.Exception, match="host-driver hand-off"):
        node_layer.test_toolkit_leaves_cgroups_to_lxc(node, {"container": {"gpu_handoff": "host-driver"}})
