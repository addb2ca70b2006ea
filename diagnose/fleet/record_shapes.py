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
- journald (`journalctl -o json`): `MESSAGE`, the host (`_HOSTNAME`) and unit
  (`_SYSTEMD_UNIT`, else `SYSLOG_IDENTIFIER`) as the source, `_PID` a label;
- Docker's json-file lines (`log`, `stream`, `time`): the container from the file's path
  (`/var/lib/docker/containers/ID/ID-json.log`), else the file;
- any other JSON object when `--key FIELD` (several: each a part of the identity) names the
  fields that tell sources apart (dotted paths), the message in `message`, `log`, `msg`,
  `line`, `body` or `MESSAGE`; `host`/`hostname`/`_HOSTNAME` name the node;
- plain text: a line of its input file (stdin: `-`, or `--source`), or of the pod and container
  `kubectl logs --prefix` puts in brackets, or of the service `docker compose logs` puts
  before a bar (an engine's own JSON log lines are text too: the scan unwraps those itself).

A record's own time (or its collector's) comes with it, as ISO-8601 UTC.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..base.bounded import kept

_CRI = re.compile(r"^(\d{4}-\d\d-\d\dT\S+) (stdout|stderr) ([FP]) ?(.*)$", re.DOTALL)
# `kubectl logs --prefix`: [pod/NAME/CONTAINER] (other kinds: deployment/…, job/…)
_KUBECTL = re.compile(
    r"^\[(?:pod|deployment|statefulset|job|daemonset|replicaset)/([^/\]\s]+)/([^\]\s]+)\] ?(.*)$", re.DOTALL
)
# `docker compose logs`: SERVICE-1  | line (v1: PROJECT_SERVICE_1): the replica number is required
_COMPOSE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*[-_]\d+)\s+\| ?(.*)$", re.DOTALL)
_DOCKER_FILE = re.compile(r"/containers/([0-9a-f]{12,64})/\1-json\.log(?:\.\d+)?$")
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) (.*)$", re.DOTALL)
MESSAGE_KEYS = ("message", "log", "msg", "line", "body", "MESSAGE")
NODE_KEYS = ("_HOSTNAME", "host", "hostname", "node", "node_name")
PARTIAL_MAX = 1 << 20  # a CRI partial line joined up to this much (the scan's own line limit)


def _is_cri(text: str) -> re.Match[str] | None:
    """A container runtime's line (it starts with its year: the regex only for those)."""
    return _CRI.match(text) if text[:2] == "20" else None


@dataclass(slots=True)
class Record:
    source: str  # the key sessions are kept by: namespace/pod/container, or the --key values
    labels: dict[str, str]  # pod, namespace, container, node (what is known)
    lines: list[str]  # the log lines it carries (a record may carry several, or none)
    shape: (
        str  # vector / fluent-bit / otlp / loki / journald / docker / cri / kubectl / compose / keyed / text
    )
    time: str | None = None  # the record's (or its collector's) time, ISO-8601 UTC


_KNOWN: dict[tuple[Any, ...], tuple[str, dict[str, str]]] = {}  # identity by its raw fields
KNOWN_MAX = 100_000


def _known(key: tuple[Any, ...], raw: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The source and labels of a record's identity fields, worked out once per identity (a
    pipeline repeats them on every record of a pod); the same labels dict each time."""
    got = _KNOWN.get(key)
    if got is None:
        labels = _clean(raw)
        got = kept(_KNOWN, key, (_identity(labels), labels), KNOWN_MAX)
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


def _journal_text(msg: Any) -> Any:
    """journald writes a message that is not valid UTF-8 as an array of its bytes."""
    if isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        return bytes(msg).decode("utf-8", "replace")
    return msg


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


# JSON records read by the standard library before orjson is imported (20 ms: a short input
# never pays it; with it and its guard a record decodes in 1.8 us instead of 2.9)
FAST_JSON_AFTER = 4096


def fast_loads() -> Callable[[str], Any]:
    """orjson's loads where it is installed, with the standard library's answer wherever
    orjson refuses a text json accepts (NaN, infinities, lone surrogates) or reads it
    otherwise (an integer past 64 bits, 19 digits or more, becomes a float there): the same
    objects either way."""
    try:
        import orjson
    except ImportError:
        return json.loads
    fast = orjson.loads
    digits = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))  # a digit: "0"
    run = b"0" * 19

    def loads(text: str) -> Any:
        raw = text.encode("utf-8", "surrogatepass")
        if run in raw.translate(digits):  # two C passes: a regex search cost 2.6 us a record
            return json.loads(text)
        try:
            return fast(raw)
        except ValueError:  # orjson.JSONDecodeError is one
            return json.loads(text)

    return loads


class RecordReader:
    """Turns input lines into records; keeps the CRI partial lines of each source until whole.
    `key`: the fields (dotted paths) whose values are a source's identity; `text_source`: the
    name of plain text from any input (default: the input's own name)."""

    def __init__(self, key: str | list[str] | None = None, text_source: str | None = None):
        keys = [key] if isinstance(key, str) else list(key or [])
        self.keys = [k.strip() for part in keys for k in part.split(",") if k.strip()]
        self.text_source = text_source
        self._partials: dict[str, str] = {}
        self._loads: Callable[[str], Any] = json.loads
        self._json_read = 0  # JSON records read with the standard library, until FAST_JSON_AFTER

    def read(self, raw: str, name: str | None = None) -> list[Record]:
        """The records of one input line; `name`: the input it came from (a file, `-`)."""
        line = raw.rstrip("\r\n")
        obj: Any = None
        if line.startswith("{"):
            try:
                obj = self._loads(line)
            except ValueError:
                obj = None
            if self._json_read < FAST_JSON_AFTER:
                self._json_read += 1
                if self._json_read == FAST_JSON_AFTER:
                    self._loads = fast_loads()
        shaped = self._from_json(obj, name) if isinstance(obj, dict) else None
        records = shaped if shaped is not None else (self._from_text(line, name),)
        return [self.joined(r) for r in records]

    def joined(self, r: Record) -> Record:
        """The record with its CRI lines read (partial ones joined per source): in any record, a
        node agent's file or a pipeline that kept them raw."""
        if len(r.lines) == 1 and r.lines[0][:2] != "20":
            return r  # one line and not a runtime's (they start with the year): nothing to join
        out: list[str] = []
        for text in r.lines:
            m = _is_cri(text)
            if m is None:
                out.append(text)
                continue
            if r.time is None:
                r.time = m.group(1)
            held = self._partials.pop(r.source, "")
            if m.group(3) == "P":
                self._partials[r.source] = (held + m.group(4))[:PARTIAL_MAX]
            else:
                out.append(held + m.group(4))
        r.lines = out
        return r

    def _text_name(self, name: str | None) -> str:
        return self.text_source or name or "-"

    def _from_text(self, line: str, name: str | None) -> Record:
        first = line[:1]
        if first == "[" and (m := _KUBECTL.match(line)):  # kubectl logs --prefix [--timestamps]
            pod, container, rest = m.groups()
            source, labels = _known(("k", pod, container), {"pod": pod, "container": container})
            stamped = _RFC3339.match(rest) if rest[:2] == "20" else None
            if stamped:
                return Record(source, labels, [stamped.group(2)], "kubectl", stamped.group(1))
            return Record(source, labels, [rest], "kubectl")
        if first.isalnum() and " |" in line[:100] and (m := _COMPOSE.match(line)):
            service, rest = m.groups()
            source, labels = _known(("c", service), {"service": service})
            return Record(source, labels, [rest], "compose")
        return Record(self._text_name(name), {}, [line], "cri" if _is_cri(line) else "text")

    def _from_json(self, obj: dict[str, Any], name: str | None) -> Iterable[Record] | None:
        if self.keys:
            keyed = self._keyed(obj)
            if keyed is not None:
                return iter([keyed])
        k8s = obj.get("kubernetes")
        if isinstance(k8s, dict) and ("message" in obj or "log" in obj):
            if "message" in obj:  # Vector
                ns, pod = k8s.get("pod_namespace"), k8s.get("pod_name")
                container, node = k8s.get("container_name"), k8s.get("pod_node_name")
                key = ("v", ns, pod, container, node)
                source, labels = _KNOWN.get(key) or _known(
                    key, {"namespace": ns, "pod": pod, "container": container, "node": node}
                )
                return (Record(source, labels, _text_lines(obj["message"]), "vector", obj.get("timestamp")),)
            ns, pod = k8s.get("namespace_name"), k8s.get("pod_name")  # Fluent Bit
            container, node = k8s.get("container_name"), k8s.get("host")
            source, labels = _known(
                ("f", ns, pod, container, node),
                {"namespace": ns, "pod": pod, "container": container, "node": node},
            )
            when = obj.get("time") or obj.get("@timestamp") or obj.get("date")
            return iter([Record(source, labels, _text_lines(obj["log"]), "fluent-bit", when)])
        if "MESSAGE" in obj and ("_HOSTNAME" in obj or "_SYSTEMD_UNIT" in obj or "__CURSOR" in obj):
            return iter([self._journald(obj)])
        if "log" in obj and "stream" in obj and "time" in obj:  # Docker's json-file driver
            return iter([self._docker(obj, name)])
        if "resourceLogs" in obj:
            return self._otlp_request(obj)
        if "body" in obj and ("resource" in obj or "attributes" in obj):
            attrs = _otlp_attrs(_dig(obj, "resource.attributes"))
            attrs.update(
                {k: v for k, v in _otlp_attrs(obj.get("attributes")).items() if k.startswith("k8s.")}
            )
            labels = _otlp_labels(attrs)
            when = obj.get("timeUnixNano") or obj.get("observedTimeUnixNano")
            return iter(
                [Record(_identity(labels), labels, _text_lines(_otlp_value(obj["body"])), "otlp", when)]
            )
        if isinstance(obj.get("labels"), dict) and "line" in obj:  # logcli --output jsonl
            labels = self._loki_labels(obj["labels"])
            return iter(
                [Record(_identity(labels), labels, _text_lines(obj["line"]), "loki", obj.get("timestamp"))]
            )
        if isinstance(_dig(obj, "data.result"), list):
            return self._loki_response(obj)
        return None

    def _keyed(self, obj: dict[str, Any]) -> Record | None:
        """`--key`: the values of the fields named, in order, are the source (the host first
        when the record names one the keys do not: a unit is one per host)."""
        values = [_dig(obj, k) for k in self.keys]
        if all(v is None for v in values):
            return None
        node = next((obj[k] for k in NODE_KEYS if obj.get(k) not in (None, "")), None)
        parts = [str(v) for v in values if v is not None]
        labels = {
            k.rsplit(".", 1)[-1].lstrip("_").lower(): str(v)
            for k, v in zip(self.keys, values, strict=True)
            if v is not None
        }
        if node is not None and not any(k in NODE_KEYS for k in self.keys):
            parts.insert(0, str(node))
        if node is not None:
            labels["node"] = str(node)
        labels["key"] = "/".join(parts)
        msg = next((obj[k] for k in MESSAGE_KEYS if k in obj), None)
        when = (
            obj.get("__REALTIME_TIMESTAMP")
            or obj.get("timestamp")
            or obj.get("time")
            or obj.get("@timestamp")
        )
        return Record("/".join(parts), labels, _text_lines(_journal_text(msg)), "keyed", when)

    def _journald(self, obj: dict[str, Any]) -> Record:
        host = obj.get("_HOSTNAME")
        unit = obj.get("_SYSTEMD_UNIT") or obj.get("SYSLOG_IDENTIFIER") or obj.get("_COMM")
        pid = obj.get("_PID")
        labels = _known(("j", host, unit, pid), {"node": host, "unit": unit, "pid": pid})[1]
        source = "/".join(str(x) for x in (host, unit) if x) or "-"  # a unit is one per host
        lines = _text_lines(_journal_text(obj.get("MESSAGE")))
        return Record(source, labels, lines, "journald", obj.get("__REALTIME_TIMESTAMP"))

    def _docker(self, obj: dict[str, Any], name: str | None) -> Record:
        found = _DOCKER_FILE.search(name or "")
        if found:
            cid = found.group(1)[:12]
            source, labels = cid, _known(("d", cid), {"container_id": cid})[1]
        else:
            source, labels = self._text_name(name), {}
        return Record(source, labels, _text_lines(obj.get("log")), "docker", obj.get("time"))

    def _otlp_request(self, obj: dict[str, Any]) -> Iterator[Record]:
        for rl in obj.get("resourceLogs") or []:
            labels = _otlp_labels(_otlp_attrs(_dig(rl, "resource.attributes")))
            records = [lr for sl in rl.get("scopeLogs") or [] for lr in sl.get("logRecords") or []]
            records.sort(key=lambda lr: int(lr.get("timeUnixNano") or lr.get("observedTimeUnixNano") or 0))
            lines = [x for lr in records for x in _text_lines(_otlp_value(lr.get("body")))]
            last = records[-1] if records else {}
            when = last.get("timeUnixNano") or last.get("observedTimeUnixNano")
            yield Record(_identity(labels), labels, lines, "otlp", when)

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
            lines = [x for v in values for x in _text_lines(v[1])]
            yield Record(_identity(labels), labels, lines, "loki", values[-1][0] if values else None)
