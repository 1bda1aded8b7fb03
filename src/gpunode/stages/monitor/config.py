"""Prometheus' scrape configuration for the monitor stage (issue 37): one job per kind of target,
whose names the alert rules read (roles/monitor/files/gpunode-alerts.yml: ``up{job="sglang"}`` and
so on), every target labelled with the host file's host name (``host``) and a server's with its
container's name (``container``), and the model store's mount tagged ``gpunode_store="model"`` by
metric relabelling so that one rule finds it on every host. Plain data in, a dict out: the role
writes it as YAML and Prometheus' own ``promtool check config`` judges it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The jobs, by what they scrape; the alert rules name these.
JOB_SERVER, JOB_ROUTER, JOB_GPUS, JOB_NODE = "sglang", "sglang_router", "gpunode_gpu", "node"
JOBS = (JOB_SERVER, JOB_ROUTER, JOB_GPUS, JOB_NODE)
STORE_LABEL = "gpunode_store"
NODE_EXPORTER_PORT = 9100  # Debian's prometheus-node-exporter default
ALERTMANAGER_PORT = 9093  # Debian's prometheus-alertmanager default


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
    rule_files: tuple[str, ...] = ("/etc/prometheus/gpunode-alerts.yml",)
    alertmanagers: tuple[str, ...] = (f"127.0.0.1:{ALERTMANAGER_PORT}",)
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
