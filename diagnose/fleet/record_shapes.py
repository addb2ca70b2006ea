"""Log records as the pipelines emit them → (source, labels, log lines).

`diagnose stream` reads one record a line, in whichever of these shapes it comes (each
recognised by its own fields, so one input may mix them):

- Vector's `kubernetes_logs` source: `message`, `kubernetes.pod_name`, `.pod_namespace`,
  `.container_name`, `.pod_node_name`;
- Fluent Bit's kubernetes filter: `log`, `kubernetes.pod_name`, `.namespace_name`,
  `.container_name`, `.host`;
- OTLP JSON: an `ExportLogsServiceRequest` (`resourceLogs[].scopeLogs[].logRecords[]`, what the
  OpenTelemetry Collector's file exporter writes) or one flattened record (`body`,
  `resource.attributes`); identity from `k8s.pod.name`, `k8s.namespace.name`,
  `k8s.container.name`, `k8s.node.name`, else `service.name`;
- Loki: `logcli query --output jsonl` lines (`labels`, `line`) or a `query_range` response
  (`data.result[].stream` / `.values`, put back in time order: Loki answers newest first);
- Kubernetes CRI log lines (`<time> stdout|stderr F|P <message>`; partial `P` lines joined);
- any other JSON object when `--key FIELD` names the field that tells sources apart
  (a dotted path), the message in `message`, `log`, `msg`, `line` or `body`;
- plain text: a line of the one source `-` (an engine's own JSON log lines included: the scan
  unwraps those itself).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_CRI = re.compile(r"^(\d{4}-\d\d-\d\dT\S+) (stdout|stderr) ([FP]) ?(.*)$", re.DOTALL)
MESSAGE_KEYS = ("message", "log", "msg", "line", "body", "MESSAGE")
PARTIAL_MAX = 1 << 20  # a CRI partial line joined up to this much (the scan's own line limit)


def _is_cri(text: str) -> re.Match[str] | None:
    """A container runtime's line (it starts with its year: the regex only for those)."""
    return _CRI.match(text) if text[:2] == "20" else None


@dataclass(slots=True)
class Record:
    source: str  # the key sessions are kept by: namespace/pod/container, or the --key value
    labels: dict[str, str]  # pod, namespace, container, node (what is known)
    lines: list[str]  # the log lines it carries (a record may carry several, or none)
    shape: str  # vector / fluent-bit / otlp / loki / cri / keyed / text


_KNOWN: dict[tuple[Any, ...], tuple[str, dict[str, str]]] = {}  # identity by its raw fields
KNOWN_MAX = 100_000


def _known(key: tuple[Any, ...], raw: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The source and labels of a record's identity fields, worked out once per identity (a
    pipeline repeats them on every record of a pod); the same labels dict each time."""
    got = _KNOWN.get(key)
    if got is None:
        if len(_KNOWN) >= KNOWN_MAX:
            _KNOWN.clear()
        labels = _clean(raw)
        got = _KNOWN[key] = (_identity(labels), labels)
    return got


def _identity(labels: dict[str, str]) -> str:
    parts = [labels.get(k, "") for k in ("namespace", "pod", "container")]
    return "/".join(p for p in parts if p) or labels.get("service", "") or "-"


def _clean(d: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in d.items() if v not in (None, "")}


def _text_lines(msg: Any) -> list[str]:
    """A record's message as log lines: one per line it holds (a trailing newline is not one)."""
    if msg is None:
        return []
    if not isinstance(msg, str):
        msg = json.dumps(msg, ensure_ascii=False)
    return msg.rstrip("\r\n").split("\n") if msg else [""]


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _otlp_value(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in v:
            return v[key]
    return json.dumps(v, ensure_ascii=False)


def _otlp_attrs(attrs: Any) -> dict[str, Any]:
    if isinstance(attrs, dict):  # some exporters flatten them
        return attrs
    out: dict[str, Any] = {}
    for a in attrs or []:
        if isinstance(a, dict) and "key" in a:
            out[a["key"]] = _otlp_value(a.get("value"))
    return out


def _otlp_labels(attrs: dict[str, Any]) -> dict[str, str]:
    return _clean(
        {
            "namespace": attrs.get("k8s.namespace.name"),
            "pod": attrs.get("k8s.pod.name"),
            "container": attrs.get("k8s.container.name"),
            "node": attrs.get("k8s.node.name"),
            "service": attrs.get("service.name"),
        }
    )


class RecordReader:
    """Turns input lines into records; keeps the CRI partial lines of each source until whole."""

    def __init__(self, key: str | None = None, text_source: str = "-"):
        self.key = key
        self.text_source = text_source
        self._partials: dict[str, str] = {}

    def read(self, raw: str) -> Iterator[Record]:
        line = raw.rstrip("\r\n")
        obj: Any = None
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
        shaped = self._from_json(obj) if isinstance(obj, dict) else None
        records = list(shaped) if shaped is not None else [self._from_text(line)]
        for r in records:
            yield self.joined(r)

    def joined(self, r: Record) -> Record:
        """The record with its CRI lines read (partial ones joined per source): in any record, a
        node agent's file or a pipeline that kept them raw."""
        out: list[str] = []
        for text in r.lines:
            m = _is_cri(text)
            if m is None:
                out.append(text)
                continue
            held = self._partials.pop(r.source, "")
            if m.group(3) == "P":
                self._partials[r.source] = (held + m.group(4))[:PARTIAL_MAX]
            else:
                out.append(held + m.group(4))
        r.lines = out
        return r

    def _from_text(self, line: str) -> Record:
        return Record(self.text_source, {}, [line], "cri" if _is_cri(line) else "text")

    def _from_json(self, obj: dict[str, Any]) -> Iterator[Record] | None:
        if self.key is not None:
            value = _dig(obj, self.key)
            if value is not None:
                msg = next((obj[k] for k in MESSAGE_KEYS if k in obj), None)
                return iter([Record(str(value), {"key": str(value)}, _text_lines(msg), "keyed")])
        k8s = obj.get("kubernetes")
        if isinstance(k8s, dict) and ("message" in obj or "log" in obj):
            if "message" in obj:  # Vector
                ns, pod = k8s.get("pod_namespace"), k8s.get("pod_name")
                container, node = k8s.get("container_name"), k8s.get("pod_node_name")
                source, labels = _known(
                    ("v", ns, pod, container, node),
                    {"namespace": ns, "pod": pod, "container": container, "node": node},
                )
                return iter([Record(source, labels, _text_lines(obj["message"]), "vector")])
            ns, pod = k8s.get("namespace_name"), k8s.get("pod_name")  # Fluent Bit
            container, node = k8s.get("container_name"), k8s.get("host")
            source, labels = _known(
                ("f", ns, pod, container, node),
                {"namespace": ns, "pod": pod, "container": container, "node": node},
            )
            return iter([Record(source, labels, _text_lines(obj["log"]), "fluent-bit")])
        if "resourceLogs" in obj:
            return self._otlp_request(obj)
        if "body" in obj and ("resource" in obj or "attributes" in obj):
            attrs = _otlp_attrs(_dig(obj, "resource.attributes"))
            attrs.update(
                {k: v for k, v in _otlp_attrs(obj.get("attributes")).items() if k.startswith("k8s.")}
            )
            labels = _otlp_labels(attrs)
            return iter([Record(_identity(labels), labels, _text_lines(_otlp_value(obj["body"])), "otlp")])
        if isinstance(obj.get("labels"), dict) and "line" in obj:  # logcli --output jsonl
            labels = self._loki_labels(obj["labels"])
            return iter([Record(_identity(labels), labels, _text_lines(obj["line"]), "loki")])
        if isinstance(_dig(obj, "data.result"), list):
            return self._loki_response(obj)
        return None

    def _otlp_request(self, obj: dict[str, Any]) -> Iterator[Record]:
        for rl in obj.get("resourceLogs") or []:
            labels = _otlp_labels(_otlp_attrs(_dig(rl, "resource.attributes")))
            records = [lr for sl in rl.get("scopeLogs") or [] for lr in sl.get("logRecords") or []]
            records.sort(key=lambda lr: int(lr.get("timeUnixNano") or lr.get("observedTimeUnixNano") or 0))
            lines = [x for lr in records for x in _text_lines(_otlp_value(lr.get("body")))]
            yield Record(_identity(labels), labels, lines, "otlp")

    @staticmethod
    def _loki_labels(stream: dict[str, Any]) -> dict[str, str]:
        return _clean(
            {
                "namespace": stream.get("namespace") or stream.get("k8s_namespace_name"),
                "pod": stream.get("pod") or stream.get("k8s_pod_name"),
                "container": stream.get("container") or stream.get("k8s_container_name"),
                "node": stream.get("node_name") or stream.get("node") or stream.get("k8s_node_name"),
                "service": stream.get("service_name") or stream.get("job"),
            }
        )

    def _loki_response(self, obj: dict[str, Any]) -> Iterator[Record]:
        for res in _dig(obj, "data.result") or []:
            if not isinstance(res, dict):
                continue
            labels = self._loki_labels(res.get("stream") or {})
            values = [v for v in res.get("values") or [] if isinstance(v, list) and len(v) >= 2]
            values.sort(key=lambda v: int(v[0]))  # Loki answers newest first by default
            yield Record(_identity(labels), labels, [x for v in values for x in _text_lines(v[1])], "loki")
