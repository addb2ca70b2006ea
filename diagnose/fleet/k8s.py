"""`diagnose k8s`: why an inference server's pod fails, from what the API server knows.

For each pod (namespace, label selector) and container, with the official `kubernetes`
client: the current log, and the `previous` log of a restarted container (the run that
crashed); `lastState.terminated` (reason, exit code, started and finished times); the pod's
Events (`Killing … failed liveness/startup probe`, `FailedScheduling … nvidia.com/gpu`,
`BackOff`, `OOMKilled`); the probes of its spec. The verdict joins them:
- the log's own failure (a CUDA OOM, a KV cache too small, …) with its change;
- a kill by a liveness or startup probe while the server was still starting (loading
  weights): the probe budget to set, from how long the run lasted and how far the load got;
- exit 137 OOMKilled with no CUDA OOM in the log: host memory, the container's memory limit;
- a pending pod for lack of GPUs;
- a healthy container.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import InputError
from ..knowledge.loaded import Knowledge
from ..model.records import Diagnosis
from ..model.taxonomy import TAXONOMY
from ..stream.session import StreamSession

SCHEMA = "diagnose.k8s/1"
LOG_BYTES = 16 << 20  # a container's log read at most (the kubelet rotates at 10 MiB by default)
STARTUP_MARGIN = 1.5  # the startup budget advised: this times the time the start is expected to take
_PROBE_KILL = re.compile(r"failed (liveness|startup) probe", re.I)
_GPU_WORDS = re.compile(r"nvidia\.com/gpu|amd\.com/gpu|gpu", re.I)
# the phases of a start not yet ready, in the taxonomy's order
STARTING_PHASES = TAXONOMY.phases[: TAXONOMY.phases.index("ready")]


@dataclass
class ContainerVerdict:
    namespace: str
    pod: str
    container: str
    node: str | None
    status: str  # failed / degraded / ready / incomplete / pending
    cls: str | None  # a taxonomy class from the log, or probe_killed / host_oom_killed / unschedulable
    phase: str | None  # the last startup phase the log reached
    evidence: str
    change: dict[str, Any] | None
    restarts: int = 0
    terminated: dict[str, Any] | None = None  # lastState.terminated: reason, exit_code, times
    events: list[str] = field(default_factory=list)  # the pod's Warning events, as `kubectl` shows them
    log_used: str = "current"  # which log the verdict read: current or previous
    diagnosis: Diagnosis | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "namespace": self.namespace,
            "pod": self.pod,
            "container": self.container,
            "node": self.node,
            "status": self.status,
            "class": self.cls,
            "phase": self.phase,
            "evidence": self.evidence,
            "change": self.change,
            "restarts": self.restarts,
            "last_terminated": self.terminated,
            "events": self.events,
            "log": self.log_used,
            "diagnosis": self.diagnosis.to_json() if self.diagnosis is not None else None,
        }


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """CoreV1Api from the in-cluster service account, else the kubeconfig (KUBECONFIG, ~/.kube/config)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise InputError(
            "diagnose k8s needs the kubernetes client: pip install 'diagnose-llm[k8s]'"
        ) from None
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
                return client.CoreV1Api()
            except config.ConfigException:
                pass
        config.load_kube_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        raise InputError(f"no usable Kubernetes configuration: {e}") from None
    return client.CoreV1Api()


def _api_error(e: Exception, what: str) -> InputError:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or type(e).__name__
    return InputError(f"the Kubernetes API refused {what}: {status or ''} {reason}".replace("  ", " "))


def examine(api: Any, know: Knowledge, namespace: str, selector: str | None = None) -> list[ContainerVerdict]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        pods = api.list_namespaced_pod(namespace, label_selector=selector or "").items
    except (ApiException, HTTPError) as e:
        raise _api_error(e, f"listing the pods of {namespace}") from None
    out: list[ContainerVerdict] = []
    for pod in pods:
        name = pod.metadata.name
        try:
            events = api.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        except (ApiException, HTTPError):
            events = []  # events are a help, not a must (RBAC may not allow them)
        out += _pod_verdicts(api, know, pod, events)
    return out


def _event_text(e: Any) -> str:
    return f"{e.type or ''} {e.reason or ''}: {' '.join((e.message or '').split())}".strip()


def _pod_verdicts(api: Any, know: Knowledge, pod: Any, events: list[Any]) -> list[ContainerVerdict]:
    ns, name = pod.metadata.namespace, pod.metadata.name
    node = pod.spec.node_name
    warnings = [_event_text(e) for e in events if e.type == "Warning"]
    statuses = pod.status.container_statuses or []
    if pod.status.phase == "Pending" and not any(s.state and s.state.running for s in statuses):
        unscheduled = [e for e in events if e.reason == "FailedScheduling"]
        if unscheduled:
            msg = " ".join((unscheduled[-1].message or "").split())
            gpus = _GPU_WORDS.search(msg) is not None
            return [
                ContainerVerdict(
                    ns,
                    name,
                    c.name,
                    node,
                    "pending",
                    "unschedulable",
                    None,
                    msg,
                    _gpu_change(pod, c) if gpus else None,
                    events=warnings,
                )
                for c in pod.spec.containers
            ]
    spec_of = {c.name: c for c in pod.spec.containers}
    return [
        _container_verdict(api, know, pod, s, spec_of.get(s.name), events, warnings, node) for s in statuses
    ]


def _gpu_change(pod: Any, c: Any) -> dict[str, Any] | None:
    limits = (c.resources.limits or {}) if c.resources else {}
    gpus = next((v for k, v in limits.items() if k.endswith("/gpu")), None)
    return {
        "param": "resources.limits.nvidia.com/gpu",
        "flag": "resources.limits",
        "from": str(gpus) if gpus is not None else None,
        "to": "a count some node has free (kubectl describe nodes | grep -A8 Allocated)",
        "why": "no node has this many free GPUs: the scheduler cannot place the pod (it never started)",
        "verify": "the pod is scheduled (kubectl get pod -o wide shows a node), then its log under diagnose",
    }


def _read_log(api: Any, pod: Any, container: str, previous: bool) -> str | None:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        text = api.read_namespaced_pod_log(
            pod.metadata.name,
            pod.metadata.namespace,
            container=container,
            previous=previous,
            limit_bytes=LOG_BYTES,
        )
    except (ApiException, HTTPError):
        return None  # no previous container, or the node is gone
    return text if isinstance(text, str) else None


def _diagnose_log(know: Knowledge, source: str, text: str) -> tuple[Diagnosis, StreamSession]:
    s = StreamSession(source, know)
    s.feed(text)
    s.close()
    return s.diagnosis(), s


def _container_verdict(
    api: Any,
    know: Knowledge,
    pod: Any,
    st: Any,
    spec: Any,
    events: list[Any],
    warnings: list[str],
    node: str | None,
) -> ContainerVerdict:
    ns, name, c = pod.metadata.namespace, pod.metadata.name, st.name
    term = st.last_state.terminated if st.last_state else None
    if term is None and st.state and st.state.terminated:
        term = st.state.terminated
    terminated = None
    if term is not None:
        terminated = {
            "reason": term.reason,
            "exit_code": term.exit_code,
            "started_at": term.started_at.isoformat() if term.started_at else None,
            "finished_at": term.finished_at.isoformat() if term.finished_at else None,
        }
    previous = st.restart_count > 0 and term is not None
    text = _read_log(api, pod, c, previous=previous) if previous else None
    log_used = "previous" if text is not None else "current"
    if text is None:
        text = _read_log(api, pod, c, previous=False) or ""
    d, session = _diagnose_log(know, f"{ns}/{name}/{c}", text)
    v = ContainerVerdict(
        ns,
        name,
        c,
        node,
        d.status,
        d.primary.cls if d.primary else None,
        d.last_phase,
        d.primary.evidence if d.primary else "",
        d.advice[0].to_json() if d.advice else None,
        restarts=st.restart_count,
        terminated=terminated,
        events=warnings,
        log_used=log_used,
        diagnosis=d,
    )
    log_failed = (
        d.status == "failed" and d.primary is not None and d.primary.cls not in ("stop", "unknown_error")
    )
    probe_kill = next(
        (e for e in reversed(events) if e.reason == "Killing" and _PROBE_KILL.search(e.message or "")), None
    )
    if (
        probe_kill is not None
        and not log_failed
        and (d.last_phase in STARTING_PHASES or d.last_phase is None)
    ):
        _probe_killed(v, probe_kill, spec, term, d, session)
    elif term is not None and term.reason == "OOMKilled" and not (log_failed and d.primary.cls == "oom"):
        _host_oom(v, spec, term)
    elif term is not None and not log_failed and st.restart_count > 0 and term.exit_code not in (0, None):
        v.status = "failed"
        v.cls = v.cls or "unknown_error"
        v.evidence = v.evidence or f"the container exited with code {term.exit_code} ({term.reason})"
    elif st.ready and d.status in ("ready", "degraded", "incomplete"):
        v.status = "ready" if d.status != "degraded" else "degraded"
    return v


def _probe_budget(probe: Any) -> float | None:
    if probe is None:
        return None
    return (probe.initial_delay_seconds or 0) + (probe.period_seconds or 10) * (probe.failure_threshold or 3)


def _probe_killed(
    v: ContainerVerdict, kill: Any, spec: Any, term: Any, d: Diagnosis, s: StreamSession
) -> None:
    which = _PROBE_KILL.search(kill.message or "").group(1)  # type: ignore[union-attr]
    ran = None
    if term is not None and term.started_at and term.finished_at:
        ran = (term.finished_at - term.started_at).total_seconds()
    obs = s.scanner.server.observed
    done, total = obs.get("shards_done"), obs.get("shards_total")
    share = (
        done / total if isinstance(done, int) and isinstance(total, int) and total > 0 and done > 0 else None
    )
    probe = (spec.startup_probe or spec.liveness_probe) if spec is not None else None
    period = (probe.period_seconds if probe is not None else None) or 10
    current = _probe_budget(probe)
    needed = None
    if ran is not None:
        # the weights were still loading: the start takes at least what ran, more by what was left
        needed = ran / share if share is not None and share < 1 else ran * 2
    v.status = "failed"
    v.cls = "probe_killed"
    v.evidence = " ".join((kill.message or "").split())
    where = f" while {d.last_phase.replace('_', ' ')}" if d.last_phase else " during startup"
    threshold = math.ceil(needed * STARTUP_MARGIN / period) if needed is not None else None
    v.change = {
        "param": "startupProbe.failureThreshold",
        "flag": "startupProbe",
        "from": f"{current:.0f} s (the {which} probe's budget)" if current is not None else None,
        "to": (
            f"failureThreshold: {threshold} with periodSeconds: {period} ({threshold * period} s)"
            if threshold is not None
            else "a startupProbe whose failureThreshold × periodSeconds covers the whole load"
        ),
        "why": f"the kubelet killed the server{where}: it ran {ran:.0f} s"
        if ran is not None
        else f"the kubelet killed the server{where}",
        "verify": "the pod reaches Ready without restarts; `diagnose k8s` shows no probe kill",
    }
    if share is not None and ran is not None:
        v.change["why"] += f" and had loaded {done}/{total} weight shards"


def _host_oom(v: ContainerVerdict, spec: Any, term: Any) -> None:
    limits = (spec.resources.limits or {}) if spec is not None and spec.resources else {}
    limit = limits.get("memory")
    v.status = "failed"
    v.cls = "host_oom_killed"
    v.evidence = f"the container was OOMKilled (exit code {term.exit_code}); no CUDA out-of-memory in its log"
    v.change = {
        "param": "resources.limits.memory",
        "flag": "resources.limits.memory",
        "from": str(limit) if limit is not None else None,
        "to": _raised(str(limit)) if limit is not None else "a memory limit above the model's host-side peak",
        "why": "host memory, not GPU memory, ran out: the kernel killed the process at the container's limit "
        "(loading weights through host RAM, CPU offload, or a large swap space)",
        "verify": "the pod restarts without OOMKilled (kubectl get pod -o jsonpath='{..lastState}')",
    }


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNIT = {
    None: 1,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}


def _raised(limit: str) -> str:
    """Half again as much, in Gi."""
    m = _QUANTITY.match(limit.strip())
    if m is None:
        return f"more than {limit}"
    size = float(m.group(1)) * _UNIT[m.group(2)]
    return f"{math.ceil(size * 1.5 / 1024**3)}Gi"


def emit_event(api: Any, v: ContainerVerdict, message: str) -> None:
    """A Kubernetes Event on the pod (opt-in: --emit-events), as `kubectl describe pod` shows them."""
    import datetime as dt

    from kubernetes import client

    now = dt.datetime.now(dt.UTC)
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{v.pod}.diagnose-"),
        involved_object=client.V1ObjectReference(kind="Pod", name=v.pod, namespace=v.namespace),
        reason="DiagnoseFailed" if v.status == "failed" else "DiagnoseVerdict",
        message=message[:1024],
        type="Warning" if v.status == "failed" else "Normal",
        first_timestamp=now,
        last_timestamp=now,
        count=1,
        source=client.V1EventSource(component="diagnose"),
    )
    api.create_namespaced_event(v.namespace, body)
