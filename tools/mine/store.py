"""The mined data file: JSON with one template or frame per line, so a diff shows what a new
engine version added. Versions are kept as indices into the file's own version list."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _ranges(seen: list[int], versions: list[str]) -> str:
    """[0, 1, 2, 5] → '0.2.7–0.4.3, 0.6.6': runs of the mined versions, as people read them."""
    out = []
    idx = sorted(seen)
    start = prev = idx[0]
    for i in [*idx[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(versions[start] if start == prev else f"{versions[start]}–{versions[prev]}")
        if i is not None:
            start = prev = i
    return ", ".join(out)


def write_store(path: Path, data: dict, argv: list[str]) -> None:
    versions = data["versions"]
    head = {
        "schema": 1,
        "engine": data["engine"],
        "source": data["source"],
        "generated_by": "python -m tools.mine " + data["source"],
        "versions": versions,
        "provenance": data["provenance"],
    }
    lines = ["{", *(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items())]
    lines.append('  "templates": [')
    tpls = data["templates"]
    for i, t in enumerate(tpls):
        rec = {k: v for k, v in t.items() if k != "seen"}
        rec["versions"] = _ranges(t["seen"], versions)
        lines.append("    " + json.dumps(rec, ensure_ascii=False) + ("," if i < len(tpls) - 1 else ""))
    lines.append("  ],")
    lines.append('  "frames": {')
    frames = sorted(data["frames"].items())
    for i, (k, v) in enumerate(frames):
        lines.append(f"    {json.dumps(k)}: {json.dumps(v)}" + ("," if i < len(frames) - 1 else ""))
    lines.append("  },")
    lines.append('  "roots": {')
    roots = sorted((data.get("roots") or {}).items())
    for i, (ph, keys) in enumerate(roots):
        lines.append(f"    {json.dumps(ph)}: {json.dumps(keys)}" + ("," if i < len(roots) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.chmod(tmp, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
