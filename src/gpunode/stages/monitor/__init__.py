"""The monitor stage (issue 37): the node's GPUs as Prometheus metrics, and the alert rules that
name the fix. The stage's play, role and check layer come later; what is here runs and is tested
on its own."""
