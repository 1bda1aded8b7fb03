"""The monitor stage (issue 37): the node's GPUs as Prometheus metrics (gpus), Prometheus' and
Alertmanager's configurations (config), and the alert rules that name the fix
(roles/monitor/files/gpunode-alerts.yml). The stage's play, role tasks and check layer come later;
what is here runs and is tested on its own."""
