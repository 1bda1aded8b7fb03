"""Fixtures for the node checks: hosts selected by inventory group, facts gathered once per host."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"


def _groups(host: Any) -> list[str]:
    return list(host.backend.get_variables().get("group_names", []))


@pytest.fixture(scope="module")
def hostvars(host: Any) -> dict[str, Any]:
    return dict(host.backend.get_variables())


@pytest.fixture
def pve_host(host: Any) -> Any:
    """The host, when it is a Proxmox host (group pve_hosts); other hosts skip this check."""
    if "pve_hosts" not in _groups(host):
        pytest.skip("not-in-layer: not a Proxmox host")
    return host


@pytest.fixture
def gpu_node(host: Any) -> Any:
    """The host, when it is a GPU container (group gpu_nodes); other hosts skip this check."""
    if "gpu_nodes" not in _groups(host):
        pytest.skip("not-in-layer: not a GPU container")
    return host


def _remote_python(host: Any, module: str, call: str) -> Any:
    """Run one of gpunode's module_utils (plain Python) on the host and return its JSON."""
    source = (PLAYBOOKS / "module_utils" / f"{module}.py").read_text()
    program = source + f"\nimport json as _j\nprint(_j.dumps({call}))\n"
    return json.loads(host.check_output("python3 -c %s", program))


@pytest.fixture(scope="module")
def host_facts(host: Any, hostvars: dict[str, Any]) -> dict[str, Any]:
    if "pve_hosts" not in _groups(host):
        return {}
    facts = _remote_python(host, "nvidia_host", f"gather({hostvars['gpunode_facts_root']!r}, config_root='/')")
    facts["devices"] = _remote_python(host, "nvidia_nodes", f"scan({hostvars['gpunode_dev_root']!r}, False)")
    return facts


@pytest.fixture(scope="module")
def node_devices(host: Any) -> dict[str, Any]:
    if "gpu_nodes" not in _groups(host):
        return {}
    return _remote_python(host, "nvidia_nodes", "scan('/dev', True)")


def quote(text: str) -> str:
    return shlex.quote(text)


def docker_inspect(host: Any, kind: str, name: str) -> dict[str, Any] | None:
    """`docker {kind} inspect NAME` on the host, or None when there is no such object (or no Docker)."""
    result = host.run(f"docker {kind} inspect {quote(name)}")
    return json.loads(result.stdout)[0] if result.rc == 0 else None


def node_record(host: Any, name: str) -> dict[str, Any] | None:
    """A stage's record on the node (/etc/gpunode/NAME.json), or None when the stage never wrote it."""
    record = host.file(f"/etc/gpunode/{name}.json")
    return json.loads(record.content_string) if record.exists else None


def unit_log_tail(host: Any, unit: str, lines: int = 6) -> str:
    """A systemd unit's last journal lines, on one line (for a failing service check)."""
    out = host.run(f"journalctl -u {quote(unit)} -n {lines} --no-pager -o cat 2>/dev/null").stdout
    return " | ".join(line.strip() for line in out.splitlines() if line.strip()) or "(no journal lines)"
