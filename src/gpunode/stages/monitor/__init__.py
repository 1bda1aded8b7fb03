"""The monitor stage (issue 37): the node's GPUs as Prometheus metrics (gpus), its exporter container
on the node (stage), beside Debian's Prometheus, Alertmanager and node-exporter (the role), with the
settings gpunode.derive.monitorspec decides and the alert rules that name the fix
(roles/monitor/files/gpunode-alerts.yml)."""
