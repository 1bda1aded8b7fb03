"""Layer monitor: Debian's Prometheus, Alertmanager and node-exporter running on the node, gpunode's GPU
exporter beside the server, every scrape target up in Prometheus' own API, gpunode's alert rules
loaded, and Alertmanager ready and known to Prometheus. Nodes whose host has no monitor: section skip."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpunode.checks.conftest import assert_container_runs, quote, unit_log_tail
from gpunode.derive.monitorspec import EXPORTER_CONTAINER
from gpunode.ground.paths import COLLECTION
from gpunode.hostfile import MONITOR_PORTS

FIX = "run `gpunode provision <host file> --tags monitor`"
SERVICES = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
RULES = COLLECTION / "roles" / "monitor" / "files" / "gpunode-alerts.yml"

# Run on the node: Prometheus' and Alertmanager's answers, as one JSON object. A target not scraped
# yet (health "unknown", just after a provision) is waited for, one scrape interval and a little more.
_READ = """
import json, sys, time, urllib.request
prom, am, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
def get(url):
    try:
        r = urllib.request.urlopen(url, timeout=10)
        body = r.read().decode()
        return {"status": r.status, "json": json.loads(body) if body.startswith("{") else None}
    except Exception as e:
        return {"status": getattr(e, "code", 0), "error": str(e)}
deadline = time.monotonic() + wait
while True:
    targets = get("http://%s/api/v1/targets?state=active" % prom)
    active = ((targets.get("json") or {}).get("data") or {}).get("activeTargets") or []
    if targets.get("json") is None or all(t.get("health") != "unknown" for t in active) or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps({"targets": targets, "rules": get("http://%s/api/v1/rules?type=alert" % prom),
                  "alertmanagers": get("http://%s/api/v1/alertmanagers" % prom),
                  "am_ready": get("http://%s/-/ready" % am)}))
"""


@pytest.fixture
def monitored(gpu_node: Any, gpunode_derived: dict[str, Any]) -> dict[str, Any]:
    """The monitor stage's settings, when this node's host has a monitor: section; other nodes skip."""
    plan = gpunode_derived.get("monitor")
    if not plan:
        pytest.skip("not-in-layer: the host file gives this host no monitor: section")
    return dict(plan)


@pytest.fixture(scope="module")
def answers(host: Any, hostvars: dict[str, Any], gpunode_derived: dict[str, Any]) -> dict[str, Any]:
    """What Prometheus and Alertmanager answer on the node, read once for the layer (GPU nodes only:
    the Proxmox host carries the same derived values)."""
    plan = gpunode_derived.get("monitor") or {}
    if not plan or "gpu_nodes" not in hostvars.get("group_names", []):
        return {}
    wait = int(plan["prometheus"]["global"]["scrape_interval"].rstrip("s")) + 5
    result = host.run(f"python3 -c {quote(_READ)} {quote(plan['web'])} {quote(plan['alertmanager_web'])} {wait}")
    if result.rc != 0:
        return {"error": result.stderr.strip()[-300:]}
    return dict(json.loads(result.stdout))


def _json(answers: dict[str, Any], key: str, what: str) -> Any:
    if "error" in answers:
        pytest.fail(f"could not ask {what} on the node: {answers['error']} -> {FIX}")
    answer = answers[key]
    if answer.get("json") is None:
        pytest.fail(f"{what} does not answer on the node ({answer.get('error') or answer.get('status')}) -> {FIX}")
    return answer["json"].get("data")


@pytest.mark.parametrize("service", SERVICES)
def test_monitor_service_running(monitored: dict[str, Any], host: Any, service: str) -> None:
    unit = host.service(service)
    assert unit.is_running, f"{service} is not running on the node: {unit_log_tail(host, service)} -> {FIX}"
    assert unit.is_enabled, f"{service} is not enabled: it would not come back after a restart -> {FIX}"


def test_gpu_exporter_running(monitored: dict[str, Any], host: Any) -> None:
    """The exporter runs the server's image (its prometheus_client and nvidia-ml-py) with the plan's flags."""
    assert_container_runs(host, EXPORTER_CONTAINER, "GPU exporter", "the node", monitored["exporter_image"],
                          list(monitored["exporter_command"]), FIX)


def test_every_target_up(monitored: dict[str, Any], answers: dict[str, Any]) -> None:
    """Every target the host file implies is scraped, and none is down (with Prometheus' own error)."""
    active = _json(answers, "targets", "Prometheus")["activeTargets"]
    have = {f"{t['labels'].get('job')} {t['labels'].get('instance')}": t for t in active}
    missing = [target for target in monitored["targets"] if target not in have]
    assert not missing, f"Prometheus does not scrape {', '.join(missing)} -> {FIX}"
    down = [f"{name} ({t['health']}: {t.get('lastError') or 'not scraped yet'})"
            for name, t in have.items() if t["health"] != "up"]
    assert not down, f"scrape targets not up: {'; '.join(down)} -> a server target down is the server (its alert names " \
                     f"the fix); another target: {FIX}"


def test_alert_rules_loaded(monitored: dict[str, Any], answers: dict[str, Any]) -> None:
    groups = _json(answers, "rules", "Prometheus")["groups"]
    loaded = {rule["name"] for group in groups for rule in group.get("rules", [])}
    shipped = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    missing = sorted(shipped - loaded)
    assert not missing, f"Prometheus has not loaded the alert rules {', '.join(missing)} -> {FIX}"


def test_alertmanager_ready(monitored: dict[str, Any], answers: dict[str, Any]) -> None:
    if "error" in answers:
        pytest.fail(f"could not ask Alertmanager on the node: {answers['error']} -> {FIX}")
    ready = answers["am_ready"]
    assert ready.get("status") == 200, (f"Alertmanager at {monitored['alertmanager_web']} is not ready "
                                        f"({ready.get('error') or ready.get('status')}) -> {FIX}")
    known = [a["url"] for a in _json(answers, "alertmanagers", "Prometheus")["activeAlertmanagers"]]
    assert any(monitored["alertmanager_web"] in url for url in known), (
        f"Prometheus sends alerts to {known or 'no Alertmanager'}, not {monitored['alertmanager_web']} -> {FIX}")


def test_monitor_listens_on_loopback_only(monitored: dict[str, Any], host: Any) -> None:
    """Prometheus, Alertmanager (and its cluster port), node-exporter and the GPU exporter: loopback only."""
    ports = {*MONITOR_PORTS.values(), int(monitored["exporter_port"])}
    out = host.run("ss -Hltn").stdout
    exposed = sorted({local for local in (line.split()[3] for line in out.splitlines() if len(line.split()) > 3)
                      if int(local.rpartition(":")[2]) in ports
                      and local.rpartition(":")[0].strip("[]") not in ("127.0.0.1", "::1")})
    assert not exposed, f"listening beyond the node's loopback: {', '.join(exposed)} -> {FIX}"


@pytest.mark.parametrize("which", ["prometheus", "alertmanager"])
def test_configuration_is_the_host_files(monitored: dict[str, Any], host: Any, which: str) -> None:
    path = monitored[f"{which}_file"]
    found = host.file(path)
    assert found.exists, f"{path} is missing -> {FIX}"
    assert yaml.safe_load(found.content_string) == monitored[which], (
        f"{path} is not what the host file gives (edited by hand, or the file changed since the last provision) -> {FIX}")


def test_receivers_secrets_in_place(monitored: dict[str, Any], host: Any) -> None:
    named = [path for path in (monitored["token_file"], monitored["password_file"]) if path]
    if not named:
        pytest.skip("not-in-layer: the host file names no receiver secret")
    for path in named:
        found = host.file(path)
        assert found.exists and found.size > 0, f"{path} is missing or empty: Alertmanager cannot log in -> {FIX}"
        assert found.group == "prometheus" and found.mode == 0o640, (
            f"{path} is {found.user}:{found.group} {oct(found.mode)}, not root:prometheus 0640 -> {FIX}")
    for path in set(monitored["secret_paths"]) - set(named):
        assert not host.file(path).exists, f"{path} is left from an earlier host file -> {FIX}"
