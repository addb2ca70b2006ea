"""Measures of the mined knowledge, for the closing note and for review.

python -m tools.mine.report coverage            per source: error templates classed, frames phased
python -m tools.mine.report sample [N] [SEED]   N classed error templates at random, to check by hand
python -m tools.mine.report heldout DIR         messages new in each source's newest version: how many
                                                the tool classes right from what DIR (mined with
                                                --skip-newest) and the rules know, without the new template
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

from diagnose.knowledge.mined import ERROR_LEVELS, MinedKnowledge, Template, knowledge

ROOT = Path(__file__).resolve().parent.parent.parent
MINED = ROOT / "rules" / "mined"


def _templates(directory: Path) -> dict[str, tuple[dict, list[Template]]]:
    """Each source's data and templates, as the scan reads them (with their function's phase)."""
    from diagnose.knowledge.mined import Bundle

    out = {}
    for path in sorted(p for p in directory.glob("*.json") if not p.name.endswith(".index.json")):
        b = Bundle(str(path))
        data = json.loads(path.read_text(encoding="utf-8"))
        out[data["source"]] = (data, b.templates)
    return out


def coverage() -> None:
    table = knowledge(str(MINED)).table
    assert table is not None
    print(
        f"{'source':12} {'versions':>8} {'templates':>9} {'errors':>7} {'classed':>8} {'share':>6}   {'frames':>7} {'phased':>7} {'share':>6}"
    )
    tot_e = tot_c = 0
    for source, (data, tpls) in _templates(MINED).items():
        errors = [t for t in tpls if t.level in ERROR_LEVELS]
        for t in errors:
            table.classify(t)
        classed = sum(t.cls != "unknown_error" for t in errors)
        tot_e += len(errors)
        tot_c += classed
        keys = max((p.get("frame_keys", 0) for p in data["provenance"]), default=0)
        phased = len(data["frames"])
        fshare = f"{phased / keys:6.0%}" if keys else "     -"
        print(
            f"{source:12} {len(data['versions']):>8} {len(tpls):>9} {len(errors):>7} {classed:>8} {classed / max(1, len(errors)):6.0%}   {keys:>7} {phased:>7} {fshare}"
        )
        by = Counter(t.cls for t in errors)
        print("             " + ", ".join(f"{c} {n}" for c, n in by.most_common()))
    print(f"{'all':12} {'':>8} {'':>9} {tot_e:>7} {tot_c:>8} {tot_c / max(1, tot_e):6.0%}")


def sample(n: int, seed: int) -> None:
    table = knowledge(str(MINED)).table
    assert table is not None
    pool = []
    for _source, (_data, tpls) in _templates(MINED).items():
        for t in tpls:
            if t.level in ERROR_LEVELS:
                table.classify(t)
                if t.cls != "unknown_error":
                    pool.append(t)
    for t in random.Random(seed).sample(pool, n):
        print(f"{t.id}\t{t.cls}\t{t.row}\t{t.param or '-'}\t{t.module}\t{t.text[:160]!r}")


def _fill(t: Template) -> str:
    """The line the engine would print: placeholders filled with plausible values."""
    text = t.text.split("\n")[0]
    text = re.sub(r"\{[^{}]*\}", "7", text)
    return f"{t.exc}: {text}" if t.exc and t.level in ("raise", "assert") else text


def heldout(directory: Path) -> None:
    """For each source: the templates first seen in its newest version; the class the tool
    gives their line knowing only the older versions (rules, vocabulary, older templates)
    against the class the table gives the new template itself."""
    from diagnose.knowledge.loaded import Knowledge

    know = Knowledge.load()
    older = MinedKnowledge(str(directory))
    table = knowledge(str(MINED)).table
    assert table is not None
    for source, (data, tpls) in _templates(MINED).items():
        newest = data["versions"][-1]
        new = [t for t in tpls if t.versions == newest and t.level in ERROR_LEVELS]
        right = known = 0
        for t in new:
            table.classify(t)
            if t.cls == "unknown_error":
                continue
            known += 1
            line = _fill(t)
            got = _classify_line(line, t.engine, know, older, t.module, t.function)
            right += got == t.cls
        print(
            f"{source:12} newest {newest:10} new error templates {len(new):5}, classed {known:5}: "
            f"the tool already classes {right} right ({right / max(1, known):.0%})"
        )


def _classify_line(
    line: str, engine: str, know, older: MinedKnowledge, module: str = "x.py", function: str = "f"
) -> str:
    """What a scan of an excerpt ending on this exception line says, with only older knowledge."""
    import diagnose.knowledge.mined as mined_mod

    saved = dict(mined_mod._knowledge)
    mined_mod._knowledge[str(MINED)] = older
    try:
        import tempfile

        from diagnose.pipeline.scan import scan_sources
        from diagnose.pipeline.stages import diagnose
        from diagnose.read.sources import resolve_sources

        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            if module.endswith(".py"):
                # as a traceback prints it: the innermost frame is the module that raises it
                func = function.rsplit(".", 1)[-1] or "<module>"
                f.write(
                    f'Traceback (most recent call last):\n  File "/usr/lib/python3/dist-packages/{module}", '
                    f"line 1, in {func}\n{line}\n"
                )
            elif module.endswith(".go"):  # Ollama's slog line, the last of a failed start
                msg = line.split(": ", 1)[-1] if line.startswith("error: ") else line
                f.write(
                    f"time=2025-06-01T10:00:00.000Z level=ERROR source={module.rsplit('/', 1)[-1]}:1 "
                    f'msg="{msg}"\n'
                )
            else:  # llama.cpp and Rust: the message as its own error line
                f.write(f"ERROR {line}\n")
        res = scan_sources(
            resolve_sources([f.name]), know, engine=engine if engine in know.profiles.by_engine else None
        )
        d = diagnose(res, know, f.name, engine=engine if engine in know.profiles.by_engine else None)
        Path(f.name).unlink()
        return d.primary.cls if d.primary else "none"
    finally:
        mined_mod._knowledge.clear()
        mined_mod._knowledge.update(saved)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("coverage", "sample", "heldout"):
        print(__doc__)
        return 2
    if argv[0] == "coverage":
        coverage()
    elif argv[0] == "sample":
        sample(int(argv[1]) if len(argv) > 1 else 100, int(argv[2]) if len(argv) > 2 else 1)
    else:
        heldout(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
