"""The monitor role's alert rules (issue 37), checked the way Prometheus' own tool checks them:
`promtool check rules` loads them, `promtool test rules` (tests/unit/alerts/gpunode_alerts_test.yml)
fires each on its bad series with its whole text and keeps it quiet on the good one. Then the tests
themselves are checked: every alert has a firing case and a quiet case, and rules that fire on
anything fail them. Then the scrape configuration (gpunode.derive.monitorspec) that feeds them:
`promtool check config` accepts it with the rules, and every job a rule reads is one it scrapes. promtool is Debian's (package prometheus, 2.42 on Debian 12; scripts/setup
installs it): without it the tests skip, saying so, and under CI they fail."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import debian_tool  # noqa: E402 - tests/ put on the path just above

from gpunode.derive import monitorspec as config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "src/gpunode/ansible_collections/gpunode/core/roles/monitor/files/gpunode-alerts.yml"
TESTS = ROOT / "tests/unit/alerts/gpunode_alerts_test.yml"
# What the issue asks an alert for, each by the alert that answers it.
ASKED = {"server down or not ready": "GpunodeServerDown", "requests queued": "GpunodeRequestsQueued",
         "KV cache use above a bound": "GpunodeKvCacheFull", "a GPU missing": "GpunodeGpuMissing",
         "PCIe link below its maximum under load": "GpunodePcieLinkDegraded", "throttling": "GpunodeGpuThrottled",
         "the model store's disk nearly full": "GpunodeModelStoreFull",
         "a router worker unhealthy": "GpunodeRouterWorkerUnhealthy",
         "ECC and Xid-style health": "GpunodeGpuXid"}


@pytest.fixture(scope="module")
def promtool() -> str:
    return debian_tool("promtool", "prometheus")


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_prometheus_loads_the_rules(promtool: str) -> None:
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


def test_every_alert_fires_on_its_bad_series_and_stays_quiet_on_the_good_one(promtool: str) -> None:
    tested = subprocess.run([promtool, "test", "rules", TESTS.name], cwd=TESTS.parent, capture_output=True,
                            text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in group["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names)) >= len(set(ASKED.values()))
    assert {name: cases.get(name, set()) for name in names} == {name: {True, False} for name in names}
    assert set(ASKED.values()) <= set(names)


def test_every_alert_names_what_where_why_and_the_fix_as_a_finding_does() -> None:
    for rule in _alerts():
        assert set(rule["annotations"]) == {"summary", "cause", "fix"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["labels"]["code"].startswith("monitor."), rule["alert"]
        assert "{{ $labels.host }}" in rule["annotations"]["summary"] or "worker" in rule["annotations"]["summary"]


def test_rules_that_fire_on_anything_fail_the_tests(promtool: str, tmp_path: Path) -> None:
    """The tests have teeth: with every alert's expression replaced by one that always fires (on the
    same series), promtool fails a case of every alert."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = f"({rule['expr']}) or on() vector(1)"
            rule.pop("for", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(data))
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = ["rules.yml"]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    tested = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert tested.returncode == 1, tested.stdout + tested.stderr
    said = tested.stdout + tested.stderr
    assert {rule["alert"] for rule in _alerts() if f"alertname: {rule['alert']}" not in said} == set()


# -- the scrape configuration the rules read --------------------------------------------------------
def _fleet_targets() -> list[config.Target]:
    targets = []
    for host, address in (("pve-lab", "10.0.3.10"), ("pve-lab2", "10.0.3.12")):
        targets += [config.Target(config.JOB_SERVER, host, f"{address}:30000", {"container": "gpunode-sglang"}),
                    config.Target(config.JOB_GPUS, host, f"{address}:9835"),
                    config.Target(config.JOB_NODE, host, f"{address}:{config.NODE_EXPORTER_PORT}")]
    return [*targets, config.Target(config.JOB_ROUTER, "router", "127.0.0.1:29000")]


def test_prometheus_accepts_the_scrape_configuration_with_the_rules(promtool: str, tmp_path: Path) -> None:
    settings = config.Settings(rule_files=(str(RULES),), store_mounts=("/models/GLM-5-NVFP4",))
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config.prometheus_config(_fleet_targets(), settings)))
    checked = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout and f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


def test_every_job_the_rules_read_is_a_job_the_configuration_scrapes() -> None:
    read: set[str] = set()
    for rule in _alerts():
        for op, value in re.findall(r'job(=~?)"([^"]+)"', rule["expr"]):
            read |= set(value.split("|")) if op == "=~" else {value}
    scraped = {job["job_name"] for job in config.prometheus_config(_fleet_targets())["scrape_configs"]}
    assert read and read <= scraped == set(config.JOBS)


def test_each_target_carries_its_host_and_the_store_mount_is_tagged_for_the_rule() -> None:
    made = config.prometheus_config(_fleet_targets(), config.Settings(store_mounts=("/models/GLM-5-NVFP4",)))
    jobs = {job["job_name"]: job for job in made["scrape_configs"]}
    assert {g["targets"][0]: g["labels"] for g in jobs["sglang"]["static_configs"]} == {
        "10.0.3.10:30000": {"host": "pve-lab", "container": "gpunode-sglang"},
        "10.0.3.12:30000": {"host": "pve-lab2", "container": "gpunode-sglang"}}
    relabel = jobs["node"]["metric_relabel_configs"][0]
    assert re.fullmatch(relabel["regex"], "/models/GLM-5-NVFP4") and not re.fullmatch(relabel["regex"], "/models")
    assert (relabel["target_label"], relabel["replacement"]) == ("gpunode_store", "model")
    assert 'gpunode_store="model"' in next(r["expr"] for r in _alerts() if r["alert"] == "GpunodeModelStoreFull")
    # No router in the file: no router job.
    alone = config.prometheus_config([t for t in _fleet_targets() if t.job != config.JOB_ROUTER])
    assert "sglang_router" not in {job["job_name"] for job in alone["scrape_configs"]}


def test_one_address_for_two_hosts_is_refused_naming_both() -> None:
    twice = [config.Target(config.JOB_SERVER, "a", "10.0.3.10:30000"), config.Target(config.JOB_SERVER, "b", "10.0.3.10:30000")]
    with pytest.raises(ValueError, match="sglang target 10.0.3.10:30000 given for both a and b"):
        config.prometheus_config(twice)
    with pytest.raises(ValueError, match="unknown scrape job 'dcgm'"):
        config.Target("dcgm", "a", "10.0.3.10:9400")


@pytest.fixture(scope="module")
def amtool() -> str:
    return debian_tool("amtool", "prometheus-alertmanager")


def test_alertmanager_accepts_each_receiver_and_no_secret_is_in_its_configuration(amtool: str, tmp_path: Path) -> None:
    token, password = tmp_path / "token", tmp_path / "password"
    token.write_text("canary-token-4f1c\n")
    password.write_text("canary-password-9e2a\n")
    receivers: list[config.Webhook | config.Email] = [
        config.Webhook("https://hooks.example.com/gpunode", token_file=str(token)),
        config.Email("ops@example.com", "gpunode@example.com", "smtp.example.com:587", username="gpunode",
                     password_file=str(password))]
    for chosen in (receivers, receivers[:1], receivers[1:]):
        path = tmp_path / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config.alertmanager_config(chosen)))
        checked = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert " - 1 receivers" in checked.stdout
        assert "canary" not in path.read_text()
    with pytest.raises(ValueError, match="alerts need somewhere to go"):
        config.alertmanager_config([])


def test_alertmanager_refuses_what_it_does_not_know(amtool: str, tmp_path: Path) -> None:
    """The check has teeth: Alertmanager 0.25 has no url_file for a webhook, and amtool says so."""
    made = config.alertmanager_config([config.Webhook("https://hooks.example.com/gpunode")])
    made["receivers"][0]["webhook_configs"][0]["url_file"] = "/etc/alertmanager/url"
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(made))
    checked = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 1 and "field url_file not found" in checked.stdout + checked.stderr
