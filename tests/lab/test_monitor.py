"""The monitor stage on the lab (issue 37): Debian's real Prometheus, Alertmanager and node-exporter in the
lab's node, gpunode's GPU exporter in the stand-in image (NVML replayed from a real H200's answers),
the stand-in server's SGLang metrics. Provision with a monitor: section; every target is up in
Prometheus' own API; the server is killed and the server-down alert reaches Alertmanager within its
rule's bound (measured and printed); the alert's own fix brings the server back and the alert
resolves; a second provision changes nothing."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpunode_lab as lab
from gpunode.derive.monitorspec import EXPORTER_CONTAINER
from gpunode.derive.serverspec import CONTAINER_NAME

ROOT = Path(__file__).resolve().parents[2]
LAB_HOST = ROOT / "inventory" / "lab" / "host.yml"
NODE = "pve-lab-ct200"
SCRAPE_S = 5  # the lab's scrape and evaluation interval (the default is 15 s)
RULES = ROOT / "src/gpunode/ansible_collections/gpunode/core/roles/monitor/files/gpunode-alerts.yml"
TOKEN = "lab-webhook-token-5a1b"  # a canary: it must reach the node's secret file and nothing else
# A webhook receiver on the node's loopback: it keeps each POST's Authorization header and body.
HOOK_PORT, HOOK_LOG = 8099, "/run/gpunode-lab-webhook.jsonl"
AM_STATE = "/var/lib/prometheus/alertmanager"  # Debian's --storage.path for it
HOOK = f"""
import http.server, json
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open({HOOK_LOG!r}, "a") as out:
            out.write(json.dumps({{"path": self.path, "authorization": self.headers.get("Authorization"),
                                   "body": json.loads(body)}}) + "\\n")
        self.send_response(200); self.end_headers()
http.server.HTTPServer(("127.0.0.1", {HOOK_PORT}), Hook).serve_forever()
"""


def on_node(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(command, host=lab.CONTAINER_IP), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def api(url: str) -> Any:
    """GET on the node's loopback (Prometheus, Alertmanager), as JSON."""
    result = on_node(f"curl -sf --max-time 10 {url}")
    assert result.returncode == 0, f"{url}: {result.returncode} {result.stderr}"
    return json.loads(result.stdout)


def am_alerts(name: str) -> list[dict[str, Any]]:
    """Alertmanager's active alerts of that name (its own v2 API)."""
    return [a for a in api("http://127.0.0.1:9093/api/v2/alerts?active=true&silenced=false&inhibited=false")
            if a["labels"].get("alertname") == name]


def server_down_for_s() -> float:
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r["alert"] == "GpunodeServerDown")
    assert rule["for"].endswith("m")
    return float(rule["for"][:-1]) * 60


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab host file with a monitor: section (alerts to a webhook with a token from a file); the
    node's monitor services stopped afterwards so that the lab's later tests run without them."""
    folder = tmp_path_factory.mktemp("monitor")
    token = folder / "webhook-token"
    token.write_text(TOKEN + "\n")
    data = yaml.safe_load(LAB_HOST.read_text())
    data["hosts"][0]["monitor"] = {"scrape_interval_s": SCRAPE_S, "retention": "2d", "alerts": {"webhook": {
        "url": f"http://127.0.0.1:{HOOK_PORT}/gpunode", "token": {"file": str(token)}}}}
    path = folder / "host-monitor.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    on_node(f"systemctl stop gpunode-lab-webhook; rm -f {HOOK_LOG}")
    # Alertmanager's notification log outlives it (120 h, in its storage path), and the lab's node keeps
    # its disk from one run to the next: an earlier run stopped it before the resolved message, so it
    # would take the same alert (same labels) as already sent and stay silent for repeat_interval (4 h).
    # Each run starts with an Alertmanager that has told nobody anything.
    on_node(f"systemctl stop prometheus-alertmanager; rm -f {AM_STATE}/nflog {AM_STATE}/silences")
    hook = on_node(f"systemd-run --unit=gpunode-lab-webhook --collect python3 -c {shlex.quote(HOOK)}")
    assert hook.returncode == 0, hook.stderr
    yield path
    on_node(f"docker rm -f {EXPORTER_CONTAINER}; systemctl stop gpunode-lab-webhook; systemctl disable --now "
            "prometheus prometheus-alertmanager prometheus-node-exporter")


def notifications() -> list[dict[str, Any]]:
    """What the webhook receiver was sent, in order."""
    text = on_node(f"cat {HOOK_LOG} 2>/dev/null").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_an_alert_reaches_alertmanager_when_the_server_dies_and_resolves_after_the_fix(gpunode, monitored: Path) -> None:
    first = gpunode("provision", str(monitored), "--json", timeout=1200)
    assert first.returncode == 0, first.stderr[-4000:]
    assert json.loads(first.stdout)["stats"]["changed"].get(NODE, 0) >= 1
    assert TOKEN not in first.stdout + first.stderr

    # Every target up in Prometheus' own API, and gpunode's check of the layer agrees.
    check = gpunode("check", str(monitored), "--layer", "monitor", "--json", timeout=300)
    assert check.returncode == 0, check.stdout[-3000:]
    deadline = time.monotonic() + 3 * SCRAPE_S
    while True:
        targets = api("http://127.0.0.1:9090/api/v1/targets?state=active")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if all(h == "up" for h in health.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert health == {"sglang": "up", "gpunode_gpu": "up", "node": "up"}, targets
    # The GPU exporter reads the lab's two GPUs (the recorded H200's answers), as many as the host file gives.
    gpus = api("http://127.0.0.1:9090/api/v1/query?query=gpunode_gpus_visible")["data"]["result"]
    assert [float(s["value"][1]) for s in gpus] == [2.0], gpus
    assert on_node("cat /etc/prometheus/gpunode-secrets/webhook-token").stdout.strip() == TOKEN
    assert TOKEN not in on_node("cat /etc/prometheus/alertmanager.yml /etc/prometheus/prometheus.yml").stdout
    assert am_alerts("GpunodeServerDown") == []

    # The server dies; the alert reaches Alertmanager within its rule's `for:` and a few scrapes.
    killed = on_node(f"docker rm -f {CONTAINER_NAME}")
    assert killed.returncode == 0, killed.stderr
    started = time.monotonic()
    bound = server_down_for_s() + 4 * SCRAPE_S
    # While the alert waits out its `for:`, gpunode's own check names the same fault.
    serve = gpunode("check", str(monitored), "--layer", "serve", "--json", timeout=300)
    assert serve.returncode == 1 and any(r["check"] == "test_server_container_running" and r["status"] == "fail"
                                         for r in json.loads(serve.stdout)["results"]), serve.stdout[-2000:]
    while not am_alerts("GpunodeServerDown") and time.monotonic() - started < bound + 30:
        time.sleep(1)
    fired_s = time.monotonic() - started
    alerts = am_alerts("GpunodeServerDown")
    print(f"server killed: GpunodeServerDown in Alertmanager after {fired_s:.1f} s (bound {bound:.0f} s: "
          f"for {server_down_for_s():.0f} s + 4 scrapes of {SCRAPE_S} s)")
    assert alerts, f"no GpunodeServerDown in Alertmanager {fired_s:.0f} s after the server was killed"
    assert fired_s <= bound, f"{fired_s:.1f} s > {bound:.0f} s"
    alert = alerts[0]
    assert alert["labels"]["host"] == "pve-lab" and alert["labels"]["severity"] == "critical"
    fix = alert["annotations"]["fix"]
    assert f"docker logs --tail 100 {CONTAINER_NAME}" in fix, fix
    # Alertmanager sends it on (its group_wait, 10 s) to the webhook, with the token it read from its file.
    deadline = time.monotonic() + 40
    while not (sent := [n for n in notifications() if n["body"]["commonLabels"].get("alertname") == "GpunodeServerDown"]) \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert sent, f"the webhook got {notifications()}"
    assert sent[0]["path"] == "/gpunode" and sent[0]["authorization"] == f"Bearer {TOKEN}"
    assert sent[0]["body"]["status"] == "firing" and sent[0]["body"]["alerts"][0]["annotations"]["fix"] == fix
    print(f"webhook notified {time.monotonic() - started:.1f} s after the kill")

    # The alert's own fix brings the server back, and the alert resolves.
    command = fix.split("`")[3].split()
    assert command[:2] == ["gpunode", "provision"] and command[-2:] == ["--tags", "serve,smoke"], fix
    fixed = gpunode("provision", str(monitored), "--tags", "serve,smoke", "--json", timeout=900)
    assert fixed.returncode == 0, fixed.stderr[-4000:]
    started = time.monotonic()
    while am_alerts("GpunodeServerDown") and time.monotonic() - started < 6 * SCRAPE_S + 30:
        time.sleep(1)
    print(f"server back: GpunodeServerDown resolved {time.monotonic() - started:.1f} s after the fix's provision")
    assert am_alerts("GpunodeServerDown") == []
    firing = [a["labels"]["alertname"] for a in api("http://127.0.0.1:9090/api/v1/alerts")["data"]["alerts"]
              if a["state"] == "firing"]
    assert firing == [], firing

    # A second provision of the converged node changes nothing (ansible-runner's stats).
    second = gpunode("provision", str(monitored), "--json", timeout=900)
    assert second.returncode == 0, second.stderr[-4000:]
    assert {h: n for h, n in json.loads(second.stdout)["stats"]["changed"].items() if n} == {}
