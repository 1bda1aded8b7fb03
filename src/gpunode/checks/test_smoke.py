"""Layer smoke: the result of the last smoke test, recorded on the node by the smoke stage, for the
server container that runs now."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.checks.conftest import docker_inspect, node_record

FIX = "run `gpunode provision --tags smoke`"


def test_smoke_passed_for_the_running_server(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    record = node_record(gpu_node, "smoke")
    assert record is not None, f"no smoke result recorded on the node (/etc/gpunode/smoke.json) -> {FIX}"
    server = docker_inspect(gpu_node, "container", gpunode_derived["server_container"])
    if server is None:
        pytest.fail(f"no server container to have smoke-tested (see the serve layer) -> {FIX}")
    assert record["container"] == server["Id"], \
        f"the smoke test proved {str(record['container'])[:12]}, but the server is now {server['Id'][:12]} " \
        f"(replaced since) -> {FIX}"
    assert record["ok"], f"the smoke test failed (exit {record['exit_code']}): {'; '.join(record['failed'])} -> {FIX}"
