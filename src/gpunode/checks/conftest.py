"""Fixtures for the node checks: hosts selected by inventory group, facts gathered once per host."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from gpunode.checks import UNREACHABLE, result_field, tail
from gpunode.ground.paths import MODULE_UTILS

SSH_FAILED = 255  # ssh's own exit status: the connection failed, the command never ran


def _unreachable(host: Any) -> str | None:
    """Why the host cannot be reached (the connection's own error), or None."""
    try:
        result = host.run("true")
    except Exception as exc:  # testinfra's backends raise several types for a dead connection
        # testinfra raises with its CommandResult's repr (the ssh backend) or the whole `ansible`
        # run (the ansible backend): the connection's own error is its stderr, or Ansible's "msg".
        text = str(exc)
        stderr = result_field(text, "_stderr")
        if stderr.strip():
            return tail(stderr, 1)
        said = re.search(r'"msg":\s*"((?:[^"\\]|\\.)*)"', text)
        if said:
            return tail(said.group(1).encode().decode("unicode_escape"), 1)
        return f"{type(exc).__name__}: {tail(text.split('CommandResult(')[0]) or 'no detail'}"
    if result.rc == SSH_FAILED or (result.rc != 0 and not result.stdout):
        return tail(result.stderr) or f"exit status {result.rc}"
    return None


@pytest.fixture(scope="session")
def _reach() -> dict[str, str | None]:
    return {}


def skip_unreachable(host: Any, reach: dict[str, str | None]) -> None:
    """Each host is tried once per run; an unreachable one skips its checks with the connection's error."""
    name = host.backend.get_pytest_id()
    if name not in reach:
        reach[name] = _unreachable(host)
    if reach[name]:
        pytest.skip(f"{UNREACHABLE}: {reach[name]}")


@pytest.fixture(autouse=True)
def _reachable(request: pytest.FixtureRequest, _reach: dict[str, str | None]) -> None:
    if "host" in request.fixturenames:
        skip_unreachable(request.getfixturevalue("host"), _reach)


def _groups(host: Any) -> list[str]:
    return list(host.backend.get_variables().get("group_names", []))


def _plain(value: Any) -> Any:
    """A value as the host file gave it: ansible-inventory shows a string of gpunode's data (written
    !unsafe, gpunode.inventory.write) as {"__ansible_unsafe": string}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@pytest.fixture(scope="module")
def hostvars(host: Any) -> dict[str, Any]:
    return dict(_plain(host.backend.get_variables()))


# What gpunode's inventory carries for each host (gpunode.inventory.host_vars), as the stages read
# it: the validated host file entry, the values derived from it, the run's secret files. (Module
# scoped, so set up before the pve_host/gpu_node skips: the inventory's localhost has none.)
@pytest.fixture(scope="module")
def gpunode_host(hostvars: dict[str, Any]) -> dict[str, Any]:
    return dict(hostvars.get("gpunode_host") or {})


@pytest.fixture(scope="module")
def gpunode_derived(hostvars: dict[str, Any]) -> dict[str, Any]:
    return dict(hostvars.get("gpunode_derived") or {})


@pytest.fixture(scope="module")
def gpunode_secrets(hostvars: dict[str, Any]) -> dict[str, Any]:
    return dict(hostvars.get("gpunode_secrets") or {})


@pytest.fixture(scope="module")
def gpunode_router(hostvars: dict[str, Any]) -> dict[str, Any]:
    """The host file's router section, on the router machine (group routers)."""
    return dict(hostvars.get("gpunode_router") or {})


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
    source = (MODULE_UTILS / f"{module}.py").read_text()
    program = source + f"\nimport json as _j\nprint(_j.dumps({call}))\n"
    result = host.run("python3 -c %s", program)
    if result.rc != 0:
        # The command is gpunode's own facts script: name it, not its body.
        pytest.fail(f"reading facts on the host failed (python3 -c <gpunode {module}.{call.split('(')[0]}>, exit "
                    f"{result.rc}): {tail(result.stderr) or 'no error output'}")
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def host_facts(host: Any, gpunode_host: dict[str, Any], _reach: dict[str, str | None]) -> dict[str, Any]:
    if "pve_hosts" not in _groups(host):
        return {}
    skip_unreachable(host, _reach)  # module-scoped: set up before the per-test reachability check
    facts = _remote_python(host, "nvidia_host", f"gather({gpunode_host['facts_root']!r}, config_root='/')")
    facts["devices"] = _remote_python(host, "nvidia_nodes", f"scan({gpunode_host['dev_root']!r}, False)")
    facts["fabric"] = _remote_python(host, "pci_fabric", f"gather({gpunode_host['facts_root']!r})")
    facts["kernels"] = _kernels(host, gpunode_host)
    return facts


# A host's kernel facts, read once per run: when the checks are collected (one test per kernel),
# then used by the host's facts.
_KERNELS: dict[str, dict[str, Any]] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _KERNELS.clear()  # `gpunode check` may run pytest more than once in one process


def _kernels(host: Any, gpunode_host: dict[str, Any]) -> dict[str, Any]:
    name = host.backend.get_pytest_id()
    if name not in _KERNELS:
        _KERNELS[name] = dict(_remote_python(host, "kernels", f"gather('/', {gpunode_host['facts_root']!r}, "
                                                              f"version={gpunode_host['driver']['version']!r})"))
    return _KERNELS[name]


def _hosts(config: pytest.Config) -> list[Any]:
    """The hosts exactly as testinfra's own plugin makes them (testinfra/plugin.py pytest_generate_tests)."""
    import testinfra

    option = config.option
    return testinfra.get_hosts((option.hosts or "").split(","), connection=option.connection,
                               ssh_config=option.ssh_config, ssh_identity_file=option.ssh_identity_file,
                               sudo=option.sudo, sudo_user=option.sudo_user, ansible_inventory=option.ansible_inventory,
                               force_ansible=option.force_ansible)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per installed kernel of the Proxmox hosts (``kernel``): the list is read from the
    hosts when the checks are collected; a host without that kernel skips it. One test per worker
    of the router (``worker``, its host's name), from the inventory alone."""
    if "worker" in metafunc.fixturenames:
        workers = [w["host"] for host in _hosts(metafunc.config)
                   if "routers" in host.backend.get_variables().get("group_names", [])
                   for w in _plain(host.backend.get_variables()["gpunode_derived"])["workers"]]
        metafunc.parametrize("worker", workers or ["no-router"])
    if "kernel" not in metafunc.fixturenames:
        return
    found: set[str] = set()
    for host in _hosts(metafunc.config):
        variables = host.backend.get_variables()
        if "pve_hosts" not in variables.get("group_names", []) or _unreachable(host):
            continue
        try:
            found.update(k["version"] for k in _kernels(host, _plain(variables["gpunode_host"]))["kernels"])
        except (Exception, pytest.fail.Exception):  # a failed read is reported by the host's other checks
            continue
    metafunc.parametrize("kernel", sorted(found) or ["no-kernel-found"])


@pytest.fixture(scope="module")
def node_devices(host: Any, _reach: dict[str, str | None]) -> dict[str, Any]:
    if "gpu_nodes" not in _groups(host):
        return {}
    skip_unreachable(host, _reach)
    return _remote_python(host, "nvidia_nodes", "scan('/dev', True)")


def quote(text: str) -> str:
    return shlex.quote(text)


def docker_inspect(host: Any, kind: str, name: str) -> dict[str, Any] | None:
    """`docker {kind} inspect NAME` on the host, or None when there is no such object (or no Docker)."""
    result = host.run(f"docker {kind} inspect {quote(name)}")
    return json.loads(result.stdout)[0] if result.rc == 0 else None


def assert_container_runs(host: Any, name: str, what: str, where: str, image: str, argv: list[str], fix: str) -> None:
    """One of gpunode's containers exists, runs (else its last log lines say why), from ``image``
    with ``argv``."""
    found = docker_inspect(host, "container", name)
    assert found is not None, f"no {what} container {name} on {where} -> {fix}"
    logs = host.run(f"docker logs --tail 5 {quote(name)} 2>&1").stdout.strip().replace("\n", " | ")
    assert found["State"]["Running"], f"the {what} container is {found['State']['Status']}: {logs[-500:]} -> {fix}"
    assert found["Config"]["Image"] == image, f"the {what} runs {found['Config']['Image']}, the host file asks for {image} -> {fix}"
    assert found["Config"]["Cmd"] == argv, f"the {what}'s flags differ from the host file's -> {fix}"


# Run inside one of gpunode's containers: GET a path on its own port, with the key the container
# holds (read from its key file by KEY_EXPR) when it has one, so that no key leaves the machine.
# Prints the status and the body.
_GET = """
import json, os, sys, urllib.request, urllib.error
req = urllib.request.Request('http://127.0.0.1:%d' + sys.argv[1])
if os.path.exists(%r):
    req.add_header('Authorization', 'Bearer ' + (KEY_EXPR))
try:
    r = urllib.request.urlopen(req, timeout=30); print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
except Exception as e:
    print(0); print(e)
"""


def container_get(host: Any, container: str, port: int, key_file: str, key_expr: str, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` asked inside ``container`` on the host (0 when it did not answer)."""
    program = (_GET % (port, key_file)).replace("KEY_EXPR", key_expr)
    result = host.run(f"docker exec {quote(container)} python3 -c {quote(program)} {quote(path)}")
    status, _, body = result.stdout.partition("\n")
    return (int(status) if status.strip().isdigit() else 0), body.strip() or result.stderr.strip()


def node_record(host: Any, name: str) -> dict[str, Any] | None:
    """A stage's record on the node (/etc/gpunode/NAME.json), or None when the stage never wrote it."""
    record = host.file(f"/etc/gpunode/{name}.json")
    return json.loads(record.content_string) if record.exists else None


def unit_log_tail(host: Any, unit: str, lines: int = 6) -> str:
    """A systemd unit's last journal lines, on one line (for a failing service check)."""
    out = host.run(f"journalctl -u {quote(unit)} -n {lines} --no-pager -o cat 2>/dev/null").stdout
    return " | ".join(line.strip() for line in out.splitlines() if line.strip()) or "(no journal lines)"
