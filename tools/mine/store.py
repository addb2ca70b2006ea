"""The mined data file: JSON with one template or frame per line, so a diff shows what a new
engine version added. Versions are kept as indices into the file's own version list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diagnose.base.atomic import atomic_write
from diagnose.knowledge.mined_index import write_index


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
    atomic_write(path, "\n".join(lines) + "\n")
    write_index(str(path))


def main() -> int:
    """`python -m tools.mine.store [FILE ...]`: rewrite the literal index of mined files
    (default: every file in rules/mined) without mining again."""
    root = Path(__file__).resolve().parent.parent.parent / "rules" / "mined"
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for p in root.glob("*.json") if not p.name.endswith(".index.json")
    )
    for p in paths:
        write_index(str(p))
        print(f"indexed {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
