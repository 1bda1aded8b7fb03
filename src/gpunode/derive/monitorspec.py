"""The monitor stage's settings as data (issue 37), computed once by derive:

* Prometheus' scrape configuration: one job per kind of target, whose names the alert rules read
  (roles/monitor/files/gpunode-alerts.yml: ``up{job="sglang"}`` and so on), every target labelled
  with the host file's host name (``host``) and a server's with its container's name
  (``container``), and the model store's mount tagged ``gpunode_store="model"`` by metric
  relabelling so that one rule finds it on every host;
* Alertmanager's configuration, its secrets as files it reads;
* the services' arguments and the GPU exporter's container.

Plain data in, dicts out: the role writes them as YAML and Prometheus' own ``promtool check config``
and ``amtool check-config`` judge them. Everything listens on the node's loopback: an operator
reaches Prometheus with ``ssh -L``."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpunode.hostfile import MONITOR_PORTS, Monitor

# The jobs, by what they scrape; the alert rules name these.
JOB_SERVER, JOB_ROUTER, JOB_GPUS, JOB_NODE = "sglang", "sglang_router", "gpunode_gpu", "node"
JOBS = (JOB_SERVER, JOB_ROUTER, JOB_GPUS, JOB_NODE)
STORE_LABEL = "gpunode_store"
# Debian's defaults, which the host file keeps free of the server's and router's ports (MONITOR_PORTS).
NODE_EXPORTER_PORT = MONITOR_PORTS["node-exporter"]
ALERTMANAGER_PORT = MONITOR_PORTS["alertmanager"]
PROMETHEUS_PORT = MONITOR_PORTS["prometheus"]
LOOPBACK = "127.0.0.1"
# Where Debian's packages read their configuration and arguments (their units: EnvironmentFile=
# /etc/default/<package>, ExecStart=... $ARGS), and where gpunode puts its rules and secrets.
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
ALERTMANAGER_CONFIG = "/etc/prometheus/alertmanager.yml"
RULES_FILE = "/etc/prometheus/gpunode-alerts.yml"
SECRETS_DIR = "/etc/prometheus/gpunode-secrets"  # root:prometheus 0750; Alertmanager reads the files
WEBHOOK_TOKEN_FILE = f"{SECRETS_DIR}/webhook-token"
EMAIL_PASSWORD_FILE = f"{SECRETS_DIR}/email-password"
EXPORTER_CONTAINER = "gpunode-gpu-exporter"
EXPORTER_ROLE = "gpu-exporter"


@dataclass(frozen=True)
class Target:
    """One scrape target: which job, the host file's host it belongs to, ``address:port``."""

    job: str
    host: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.job not in JOBS:
            raise ValueError(f"unknown scrape job {self.job!r} (one of {', '.join(JOBS)})")


@dataclass(frozen=True)
class Settings:
    scrape_interval_s: int = 15
    rule_files: tuple[str, ...] = (RULES_FILE,)
    alertmanagers: tuple[str, ...] = (f"{LOOPBACK}:{ALERTMANAGER_PORT}",)
    store_mounts: tuple[str, ...] = ()  # the model store's mount points on the nodes


def _static(targets: list[Target]) -> list[dict[str, Any]]:
    # One static group per target: its labels are its own (host, container).
    return [{"targets": [t.address], "labels": {"host": t.host, **t.labels}} for t in targets]


def prometheus_config(targets: list[Target], settings: Settings = Settings()) -> dict[str, Any]:
    """prometheus.yml as a dict; a job with no target is left out (no router: no router job)."""
    seen: dict[tuple[str, str], str] = {}
    for target in targets:
        key = (target.job, target.address)
        if key in seen:
            raise ValueError(f"{target.job} target {target.address} given for both {seen[key]} and {target.host}")
        seen[key] = target.host
    interval = f"{settings.scrape_interval_s}s"
    jobs: list[dict[str, Any]] = []
    for job in JOBS:
        mine = [t for t in targets if t.job == job]
        if not mine:
            continue
        scrape: dict[str, Any] = {"job_name": job, "static_configs": _static(mine)}
        if job == JOB_NODE and settings.store_mounts:
            scrape["metric_relabel_configs"] = [{
                "source_labels": ["mountpoint"],
                "regex": "|".join(re.escape(m) for m in sorted(set(settings.store_mounts))),
                "target_label": STORE_LABEL, "replacement": "model"}]
        jobs.append(scrape)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(settings.rule_files),
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": list(settings.alertmanagers)}]}]},
        "scrape_configs": jobs,
    }


@dataclass(frozen=True)
class Webhook:
    """Alerts POSTed to ``url``; a bearer token, when the receiver wants one, read by Alertmanager
    from ``token_file`` on its machine (never written into the configuration)."""

    url: str
    token_file: str | None = None


@dataclass(frozen=True)
class Email:
    """Alerts mailed through ``smarthost`` (host:port); the password read by Alertmanager from
    ``password_file`` on its machine (Alertmanager 0.25's auth_password_file)."""

    to: str
    sender: str
    smarthost: str
    username: str | None = None
    password_file: str | None = None


def alertmanager_config(receivers: list[Webhook | Email], repeat_interval: str = "4h") -> dict[str, Any]:
    """alertmanager.yml as a dict: every alert to the one receiver ``gpunode`` with each target, grouped
    by alert and host; a resolved alert is sent too (the operator sees the fix took)."""
    if not receivers:
        raise ValueError("alerts need somewhere to go: give a webhook or an email receiver")
    webhooks: list[dict[str, Any]] = []
    emails: list[dict[str, Any]] = []
    for receiver in receivers:
        if isinstance(receiver, Webhook):
            hook: dict[str, Any] = {"url": receiver.url, "send_resolved": True}
            if receiver.token_file:
                hook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": receiver.token_file}}
            webhooks.append(hook)
        else:
            mail: dict[str, Any] = {"to": receiver.to, "from": receiver.sender, "smarthost": receiver.smarthost,
                                    "send_resolved": True}
            if receiver.username:
                mail["auth_username"] = receiver.username
            if receiver.password_file:
                mail["auth_password_file"] = receiver.password_file
            emails.append(mail)
    target: dict[str, Any] = {"name": "gpunode"}
    if webhooks:
        target["webhook_configs"] = webhooks
    if emails:
        target["email_configs"] = emails
    return {"route": {"receiver": "gpunode", "group_by": ["alertname", "host"], "group_wait": "10s",
                      "group_interval": "1m", "repeat_interval": repeat_interval},
            "receivers": [target]}


def _args(*flags: str) -> str:
    """A Debian ``/etc/default`` file's ARGS line (its unit expands $ARGS by whitespace)."""
    return f"ARGS={shlex.quote(' '.join(flags))}\n"


def scrape_address(bind: str, port: int) -> str:
    """Where Prometheus on the node reaches something published on ``bind:port`` there."""
    # Docker publishes on exactly that address: every address is reached at loopback, any other at itself.
    if bind == "0.0.0.0":
        return f"{LOOPBACK}:{port}"
    if bind == "::":
        return f"[::1]:{port}"
    return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"


class MonitorPlan(BaseModel):
    """What the monitor stage makes on one GPU node, decided here once (derive carries it to Ansible)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prometheus: dict[str, Any]  # prometheus.yml
    alertmanager: dict[str, Any]  # alertmanager.yml
    defaults: dict[str, str]  # Debian package -> its /etc/default file's content
    targets: tuple[str, ...]  # "job address", every one check expects up
    token_file: str | None  # where the webhook's bearer token goes on the node (Alertmanager reads it)
    password_file: str | None  # where the smarthost's password goes
    exporter_image: str  # the GPU exporter's image: the server's (prometheus_client and nvidia-ml-py are in it)
    exporter_command: tuple[str, ...]
    exporter_port: int
    expected_gpus: int | None  # the host file's count; None for gpus: all (found at run time)
    web: str  # Prometheus' own address on the node, for the check and the operator's ssh -L
    alertmanager_web: str
    prometheus_file: str = PROMETHEUS_CONFIG
    alertmanager_file: str = ALERTMANAGER_CONFIG
    rules_file: str = RULES_FILE
    secrets_dir: str = SECRETS_DIR
    secret_paths: tuple[str, ...] = (WEBHOOK_TOKEN_FILE, EMAIL_PASSWORD_FILE)  # every secret file gpunode may write


def plan(monitor: Monitor, *, host_name: str, server_bind: str, server_port: int, server_container: str,
         server_image: str, gpus: str | list[int], store_mount: str, router_metrics_port: int | None,
         nvml_module: str | None = None) -> MonitorPlan:
    """The monitor stage's plan for one GPU node: it scrapes the node's own server, GPU exporter and
    node-exporter, and the router's metrics where the router runs on this node. ``nvml_module``: what
    the exporter reads NVML through when not nvidia-ml-py's (a lab stand-in image's replay)."""
    targets = [Target(JOB_SERVER, host_name, scrape_address(server_bind, server_port), {"container": server_container}),
               Target(JOB_GPUS, host_name, f"{LOOPBACK}:{monitor.gpu_exporter_port}"),
               Target(JOB_NODE, host_name, f"{LOOPBACK}:{NODE_EXPORTER_PORT}")]
    if router_metrics_port is not None:
        targets.append(Target(JOB_ROUTER, host_name, f"{LOOPBACK}:{router_metrics_port}"))
    settings = Settings(scrape_interval_s=monitor.scrape_interval_s, store_mounts=(store_mount,))
    alerts = monitor.alerts
    receivers: list[Webhook | Email] = []
    if alerts.webhook is not None:
        receivers.append(Webhook(alerts.webhook.url, WEBHOOK_TOKEN_FILE if alerts.webhook.token else None))
    if alerts.email is not None:
        email = alerts.email
        receivers.append(Email(email.to, email.sender, email.smarthost, email.username,
                               EMAIL_PASSWORD_FILE if email.password else None))
    expected = len(gpus) if isinstance(gpus, list) else None
    listen = f"{LOOPBACK}:{monitor.gpu_exporter_port}"
    command = ("python3", "-m", "gpunode.stages.monitor.gpus", f"--listen={listen}") + (
        (f"--expected={expected}",) if expected is not None else ()) + (
        (f"--nvml-module={nvml_module}",) if nvml_module else ())
    return MonitorPlan(
        prometheus=prometheus_config(targets, settings),
        alertmanager=alertmanager_config(receivers),
        defaults={
            "prometheus": _args(f"--web.listen-address={LOOPBACK}:{PROMETHEUS_PORT}",
                                f"--storage.tsdb.retention.time={monitor.retention}"),
            # No cluster: one Alertmanager per node, and no gossip port open beyond it.
            "prometheus-alertmanager": _args(f"--web.listen-address={LOOPBACK}:{ALERTMANAGER_PORT}",
                                             "--cluster.listen-address="),
            "prometheus-node-exporter": _args(f"--web.listen-address={LOOPBACK}:{NODE_EXPORTER_PORT}"),
        },
        targets=tuple(f"{t.job} {t.address}" for t in targets),
        token_file=WEBHOOK_TOKEN_FILE if alerts.webhook is not None and alerts.webhook.token else None,
        password_file=EMAIL_PASSWORD_FILE if alerts.email is not None and alerts.email.password else None,
        exporter_image=server_image, exporter_command=command, exporter_port=monitor.gpu_exporter_port,
        expected_gpus=expected, web=f"{LOOPBACK}:{PROMETHEUS_PORT}", alertmanager_web=f"{LOOPBACK}:{ALERTMANAGER_PORT}")
