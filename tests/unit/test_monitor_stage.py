"""The monitor stage's host-file section, what derive makes of it (Prometheus' and Alertmanager's files,
judged by Debian's promtool and amtool), where its secrets go, what plan says, and how the stage treats
the exporter container it finds. The lab test (tests/lab/test_monitor.py) runs all of it for real."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode import inventory
from gpunode.derive import derive, derive_for, monitorspec
from gpunode.derive.plan import make_plan
from gpunode.derive.serverspec import LABEL_CONFIG, LABEL_HASH, LABEL_ROLE
from gpunode.hostfile import load
from gpunode.stages.monitor import stage
from gpunode.stages.serve import docker_run
from fakes.refusals import problems  # tests/ is on the path (tests/unit/conftest.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.ci import debian_tool  # noqa: E402 - tests/ put on the path just above

ROOT = Path(__file__).resolve().parents[2]
LAB_HOST = ROOT / "inventory" / "lab" / "host.yml"
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
WEBHOOK = {"webhook": {"url": "https://alerts.example.com/hook/T0KEN-IN-PATH", "token": {"file": "/etc/gpunode/token"}}}
EMAIL = {"email": {"to": "oncall@example.com", "sender": "gpunode@example.com", "smarthost": "smtp.example.com:587",
                   "username": "gpunode", "password": {"env": "SMTP_PASSWORD"}}}


def with_monitor(tmp_path: Path, monitor: Any, source: Path = LAB_HOST, index: int = 0) -> Path:
    data = yaml.safe_load(source.read_text())
    data["hosts"][index]["monitor"] = monitor
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(("monitor", "expected"), [
    ({}, r"^hosts\[0\]\.monitor\.alerts: required"),
    ({"alerts": {}}, r"^hosts\[0\]\.monitor\.alerts: alerts need somewhere to go: give webhook or email"),
    ({"alerts": {"webhook": {"url": "https://user:hunter2@alerts.example.com/"}}},
     r"^hosts\[0\]\.monitor\.alerts\.webhook\.url: the URL carries user information .*never inline: give the "
     r"receiver's bearer token as monitor\.alerts\.webhook\.token"),
    ({"alerts": {"webhook": {"url": "-oProxyCommand=x"}}}, r"webhook\.url: .* is not an http\(s\) URL"),
    ({"alerts": {"webhook": {"url": "https://a.example.com/", "token": "inline-secret"}}},
     r"webhook\.token: secrets are never inline"),
    ({"alerts": {"email": {**EMAIL["email"], "to": "-f@x"}}}, r"email\.to: "),
    ({"alerts": {"email": {**EMAIL["email"], "smarthost": "smtp.example.com"}}},
     r"email\.smarthost: .* is not host:port"),
    ({"alerts": {"email": {key: v for key, v in EMAIL["email"].items() if key != "username"}}},
     r"password without username"),
    ({"alerts": WEBHOOK, "retention": "0d"}, r"monitor\.retention: "),
    ({"alerts": WEBHOOK, "retention": "15d; rm -rf /"}, r"monitor\.retention: "),
    ({"alerts": WEBHOOK, "gpu_exporter_port": 9090}, r"gpu_exporter_port 9090 is prometheus's port on the node"),
    ({"alerts": WEBHOOK, "scrape_interval_s": 0}, r"monitor\.scrape_interval_s: "),
    # What validates must be what Alertmanager and Prometheus take (amtool and promtool refused these).
    ({"alerts": {"webhook": {"url": "http://127.0.0.1:9/x\ny"}}}, r"holds a control or non-ASCII character"),
    ({"alerts": {"webhook": {"url": "http://127.0.0.1:9/x\x1b[31my"}}}, r"holds a control or non-ASCII character"),
    ({"alerts": {"webhook": {"url": "http://[fe80::1%eth0]:9/x"}}}, r"an IPv6 zone"),
    ({"alerts": {"webhook": {"url": "http://127.0.0.1:9/" + "s" * 2030}}}, r"'http://127\.0\.0\.1:9'\.\.\. is 2049 characters long: at most 2048"),
    ({"alerts": {"email": {**EMAIL["email"], "smarthost": "::1:25"}}}, r"an IPv6 address goes in brackets"),
    ({"alerts": {"email": {**EMAIL["email"], "smarthost": "mail.example.com:\uff12\uff15"}}}, r"is not host:port"),
    ({"alerts": WEBHOOK, "retention": "300y"}, r"monitor\.retention: "),
    ({"alerts": WEBHOOK, "gpu_exporter_port": 22}, r"container\.ssh\.port 22 is the GPU exporter's port"),
])
def test_a_bad_monitor_section_is_one_line_naming_where(tmp_path: Path, monitor: Any, expected: str) -> None:
    found = problems(with_monitor(tmp_path, monitor))
    assert any(re.search(expected, line) for line in found), found
    assert not any("hunter2" in line or "inline-secret" in line for line in found), found


def test_a_webhook_urls_path_is_never_repeated(tmp_path: Path) -> None:
    """A receiver's URL may be its own secret (Slack's path is): refusals show its scheme and address only."""
    for url in ("ftp://hooks.example.com/services/T00/SECRETPATH", "https://hooks.example.com:99999/SECRETPATH",
                "https://hooks.example.com/SECRETPATH\n"):
        found = problems(with_monitor(tmp_path, {"alerts": {"webhook": {"url": url}}}))
        assert found and not any("SECRETPATH" in line for line in found), found


@pytest.mark.parametrize(("bind", "address"), [("127.0.0.1", "127.0.0.1:30000"), ("127.0.0.2", "127.0.0.2:30000"),
                                                ("0.0.0.0", "127.0.0.1:30000"), ("::", "[::1]:30000"),
                                                ("::1", "[::1]:30000"), ("10.0.3.10", "10.0.3.10:30000")])
def test_the_server_is_scraped_where_docker_publishes_it(bind: str, address: str) -> None:
    assert monitorspec.scrape_address(bind, 30000) == address


def test_the_servers_port_and_the_routers_are_not_the_monitors(tmp_path: Path) -> None:
    path = with_monitor(tmp_path, {"alerts": WEBHOOK})
    data = yaml.safe_load(path.read_text())
    data["hosts"][0]["server"]["port"] = 9093
    path.write_text(yaml.safe_dump(data))
    assert any("server.port 9093 is alertmanager's port on the node (monitor)" in line for line in problems(path))
    fleet = with_monitor(tmp_path, {"alerts": WEBHOOK}, FLEET)
    data = yaml.safe_load(fleet.read_text())
    data["router"]["metrics_port"] = 9100
    fleet.write_text(yaml.safe_dump(data))
    assert any(re.search(r"^router\.metrics_port: 9100 is taken on pve-lab1's node by node-exporter", line)
               for line in problems(fleet)), problems(fleet)


def test_no_section_no_stage() -> None:
    assert derive(load(LAB_HOST).hosts[0]).monitor is None
    plans = make_plan(load(LAB_HOST))
    assert plans[0].monitor is None and "monitor" not in [s["name"] for s in plans[0].stages]


def test_derive_scrapes_the_nodes_own_targets_and_the_router_where_it_runs(tmp_path: Path) -> None:
    fleet = load(with_monitor(tmp_path, {"alerts": WEBHOOK}, FLEET))
    first = derive_for(fleet, fleet.hosts[0]).monitor
    assert first is not None
    assert first.targets == ("sglang 127.0.0.1:30000", "gpunode_gpu 127.0.0.1:9835", "node 127.0.0.1:9100",
                             "sglang_router 127.0.0.1:29000")
    # The lab has no GPU: its stand-in image's exporter reads a recorded GPU through the lab's NVML.
    assert first.exporter_command == ("python3", "-m", "gpunode.stages.monitor.gpus", "--listen=127.0.0.1:9835",
                                      "--expected=2", "--nvml-module=lab_nvml")
    assert first.exporter_image == derive(fleet.hosts[0]).server_image
    assert first.defaults["prometheus"] == ("ARGS='--web.listen-address=127.0.0.1:9090 "
                                            "--storage.tsdb.retention.time=15d'\n")
    assert "--cluster.listen-address=" in first.defaults["prometheus-alertmanager"]
    # The weights' mount is the store the rule watches: the node's own root for weights kept in the
    # node (the fleet's), the store's mount for weights fetched into the host's store (the lab host's).
    def store_relabel(plan: Any) -> dict[str, Any]:
        node_job = next(job for job in plan.prometheus["scrape_configs"] if job["job_name"] == "node")
        return node_job["metric_relabel_configs"][0]  # type: ignore[no-any-return]
    assert re.fullmatch(store_relabel(first)["regex"], "/") and store_relabel(first)["replacement"] == "model"
    one = load(with_monitor(tmp_path, {"alerts": WEBHOOK}))
    relabel = store_relabel(derive_for(one, one.hosts[0]).monitor)
    assert re.fullmatch(relabel["regex"], "/models/GLM-5-NVFP4") and not re.fullmatch(relabel["regex"], "/")
    # The host without a monitor: section has none; the router is scraped only where it runs.
    assert derive_for(fleet, fleet.hosts[1]).monitor is None


def test_promtool_and_amtool_accept_what_derive_writes(tmp_path: Path) -> None:
    host = load(with_monitor(tmp_path, {"alerts": {**WEBHOOK, **EMAIL}})).hosts[0]
    plan = derive(host).monitor
    assert plan is not None
    rules = tmp_path / "gpunode-alerts.yml"
    rules.write_text((ROOT / "src/gpunode/ansible_collections/gpunode/core/roles/monitor/files/gpunode-alerts.yml").read_text())
    prometheus = dict(plan.prometheus, rule_files=[str(rules)])
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(plan.alertmanager))
    checked = subprocess.run([debian_tool("promtool", "prometheus"), "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = subprocess.run([debian_tool("amtool", "prometheus-alertmanager"), "check-config",
                              str(tmp_path / "alertmanager.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    receiver = plan.alertmanager["receivers"][0]
    assert receiver["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] == plan.token_file
    assert receiver["email_configs"][0]["auth_password_file"] == plan.password_file


def test_the_secrets_cross_as_files_and_plan_shows_no_webhook_path(tmp_path: Path) -> None:
    path = with_monitor(tmp_path, {"alerts": {**WEBHOOK, **EMAIL}})
    hostfile = load(path)
    refs = inventory.secret_refs(hostfile)
    assert refs[("pve-lab", "alert_token")].file == Path("/etc/gpunode/token")
    assert refs[("pve-lab", "alert_password")].env == "SMTP_PASSWORD"
    assert "SMTP_PASSWORD" in inventory.secret_env_names(hostfile)
    secrets = inventory.build(hostfile, {("pve-lab", "alert_token"): Path("/run/t")})
    node = secrets["all"]["children"]["gpu_nodes"]["hosts"]["pve-lab-ct200"]["gpunode_secrets"]
    assert node["alert_token_file"] == "/run/t" and node["alert_password_file"] is None
    monitor = make_plan(hostfile)[0].monitor
    assert monitor is not None
    shown = " ".join(monitor["alerts"])
    # A webhook's path may be the receiver's own secret (Slack's are): plan shows its address only.
    assert "T0KEN-IN-PATH" not in shown and "https://alerts.example.com/..." in shown
    assert "file:/etc/gpunode/token" in shown and "env:SMTP_PASSWORD" in shown


class _Container:
    name = monitorspec.EXPORTER_CONTAINER
    attrs = {"Config": {"Image": "someone/else:1"}}

    def __init__(self, labels: dict[str, str], status: str = "running") -> None:
        self.labels, self.status = labels, status

    def reload(self) -> None:
        pass


class _Containers:
    def __init__(self, found: _Container | None) -> None:
        self.found = found

    def get(self, name: str) -> _Container:
        import docker

        assert name == monitorspec.EXPORTER_CONTAINER
        if self.found is None:
            raise docker.errors.NotFound("no such container")
        return self.found


class _Client:
    def __init__(self, found: _Container | None) -> None:
        self.containers = _Containers(found)


def _exporter(digest: str, config: str, status: str = "running") -> _Container:
    return _Container({LABEL_ROLE: monitorspec.EXPORTER_ROLE, LABEL_HASH: digest, LABEL_CONFIG: config}, status)


WANTED = {"name": monitorspec.EXPORTER_CONTAINER, "labels": {
    LABEL_ROLE: monitorspec.EXPORTER_ROLE, LABEL_HASH: "same", LABEL_CONFIG: '{"gpunode_files": "new"}'}}


@pytest.mark.parametrize(("found", "action", "reason"), [
    (None, "created", "no gpunode-gpu-exporter container yet"),
    (_exporter("same", WANTED["labels"][LABEL_CONFIG]), "kept", "same settings, already running"),
    # Another gpunode's files are another exporter: the digest is among the hashed settings.
    (_exporter("other", '{"gpunode_files": "old"}'), "replaced", "changed: gpunode_files"),
    (_exporter("same", WANTED["labels"][LABEL_CONFIG], status="exited"), "started", "same settings; it was exited"),
])
def test_the_exporter_container_is_kept_made_started_or_replaced_as_the_servers_is(
        found: _Container | None, action: str, reason: str) -> None:
    decision = docker_run.decide(_Client(found), WANTED)
    assert (decision.action, decision.reason) == (action, reason)


def test_someone_elses_container_of_the_exporters_name_is_never_touched() -> None:
    with pytest.raises(docker_run.ServeError, match=r"a container named gpunode-gpu-exporter \(image someone/else:1, "
                                                    r"running\) exists that gpunode did not start \(no "
                                                    r"io\.gpunode\.role=gpu-exporter label\)"):
        docker_run.decide(_Client(_Container({})), WANTED)


def test_the_exporter_archive_runs_on_its_own(tmp_path: Path) -> None:
    """What the stage puts in the container imports nothing but the standard library, prometheus_client and
    the NVML module: one scrape of a recorded GPU through the lab's NVML from the unpacked archive alone."""
    from gpunode_lab.image import NVML_FILES

    with tarfile.open(fileobj=io.BytesIO(stage.archive())) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    shim = tmp_path / "shim"
    shim.mkdir()
    for name, source in NVML_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(source.read_bytes())
    import prometheus_client
    import pynvml

    libs = f"{Path(prometheus_client.__file__).parents[1]}:{Path(pynvml.__file__).parent}"
    result = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path[:0] = sys.argv[1].split(':'); "
                             "from gpunode.stages.monitor.gpus import main; raise SystemExit(main(sys.argv[2:]))",
                             f"{tmp_path / 'src' / stage.IN_CONTAINER.lstrip('/')}:{shim}:{libs}", "--once", "--expected=1", "--nvml-module=lab_nvml"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'gpunode_nvml_up{error=""} 1.0' in result.stdout
    assert re.search(r"^gpunode_gpus_visible \d+\.0$", result.stdout, re.M)
    imported = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path[:0] = [sys.argv[1]]; "
                               "import gpunode.stages.monitor.gpus; print(sorted(m.split('.')[0] for m in sys.modules "
                               "if m.split('.')[0] in ('pydantic', 'yaml', 'rich', 'docker', 'typer')))",
                               str(tmp_path / "src" / stage.IN_CONTAINER.lstrip("/"))], capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0 and imported.stdout.strip() == "[]", imported.stdout + imported.stderr
