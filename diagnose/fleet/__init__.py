"""Many servers at once: the pipelines' record shapes, the node agent over /var/log/pods,
`diagnose stream`, Prometheus metrics and Alertmanager alerts, `diagnose k8s`, the
termination log.

In: records, files, the Kubernetes API. Out: verdict events, metrics, alerts, a table.
"""
