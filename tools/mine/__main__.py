"""Mine message templates and frame phases from engines' released sources.

    python -m tools.mine [ENGINE ...] [--cache DIR] [--git ENGINE=MIRROR] [--out rules/mined]
                         [--skip-newest]

Reads `tools/mine/sources.yaml`; downloads each version with `pip download --no-deps` into
the cache (wheels: only the *.py files are read; sdists: the files named) or reads tags of
a git mirror; writes `rules/mined/<source>.json`: the templates with their level,
exception type, module, function and the versions they appear in, and the frames with the
one phase their call tree gives them. The engine's code itself is never written.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import yaml

from .callgraph import frame_key, phases
from .native_source import mine_native
from .pattern import build, template_id, template_text
from .python_source import Function, mine_module
from .store import write_store

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLATFORMS = [
    "manylinux1_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
    "linux_x86_64",
    "any",
]


def glob_re(patterns: list[str]) -> re.Pattern[str]:
    """Globs with `**/` for any depth (fnmatch's `*` would cross directories too)."""
    parts = []
    for pat in patterns:
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):  # a trailing ** : anything below
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        parts.append(rx)
    return re.compile("(?:" + "|".join(parts) + r")\Z")


def _find(cache: Path, package: str, version: str, sdist: bool) -> Path | None:
    norm = package.replace("-", "_").lower()
    for f in sorted(cache.iterdir()):
        name = f.name.lower().replace("-", "_")
        if sdist and name in (f"{norm}_{version}.tar.gz", f"{norm}_{version}.zip"):
            return f
        if not sdist and f.suffix == ".whl" and name.startswith(f"{norm}_{version}_"):
            return f
    return None


def _download(package: str, version: str, cache: Path, sdist: bool) -> Path:
    """The release file in the cache, downloaded by pip when it is not there yet."""
    cache.mkdir(parents=True, exist_ok=True)
    found = _find(cache, package, version, sdist)
    if found is not None:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache)]
    if sdist:
        cmd += ["--no-binary", ":all:", "--no-build-isolation"]
    else:
        cmd += ["--only-binary", ":all:", "--python-version", "3.11"]
        for p in PLATFORMS:
            cmd += ["--platform", p]
    subprocess.run([*cmd, f"{package}=={version}"], check=False, capture_output=True)
    found = _find(cache, package, version, sdist)
    if found is None:
        raise SystemExit(f"mine: could not download {package}=={version}")
    return found


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_files(
    spec: dict, version: str, cache: Path, mirrors: dict[str, str], name: str
) -> tuple[Iterator[tuple[str, str]], dict]:
    """(path, text) of the version's files, and where they came from."""
    want = glob_re(spec["files"])
    skip = glob_re(spec["exclude"]) if spec.get("exclude") else None

    def keep(p: str) -> bool:
        return bool(want.match(p)) and not (skip and skip.match(p))

    kind = spec["kind"]
    if kind in ("wheel", "sdist"):
        archive = _download(spec["package"], version, cache, kind == "sdist")
        prov = {"version": version, "file": archive.name, "sha256": _sha256(archive)}
        if archive.suffix == ".whl":

            def gen_zip() -> Iterator[tuple[str, str]]:
                with zipfile.ZipFile(archive) as z:
                    for n in z.namelist():
                        if keep(n):
                            yield n, z.read(n).decode("utf-8", "replace")

            return gen_zip(), prov

        def gen_tar() -> Iterator[tuple[str, str]]:
            with tarfile.open(archive) as t:
                for m in t:
                    n = m.name.split("/", 1)[-1]  # drop the sdist's top folder
                    if m.isfile() and keep(n):
                        f = t.extractfile(m)
                        if f is not None:
                            yield n, f.read().decode("utf-8", "replace")

        return gen_tar(), prov
    mirror = mirrors.get(name)
    if not mirror:
        raise SystemExit(f"mine: {name} is read from a git mirror: pass --git {name}=PATH")
    commit = subprocess.run(
        ["git", "--git-dir", mirror, "rev-list", "-n1", version], capture_output=True, text=True, check=True
    ).stdout.strip()
    prov = {"version": version, "commit": commit}
    names = subprocess.run(
        ["git", "--git-dir", mirror, "ls-tree", "-r", "--name-only", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()

    def gen_git() -> Iterator[tuple[str, str]]:
        for n in names:
            if keep(n):
                out = subprocess.run(
                    ["git", "--git-dir", mirror, "show", f"{commit}:{n}"], capture_output=True, check=False
                ).stdout
                yield n, out.decode("utf-8", "replace")

    return gen_git(), prov


def mine_source(name: str, spec: dict, cache: Path, mirrors: dict[str, str], versions: list[str]) -> dict:
    engine = spec.get("engine", name)
    templates: dict[str, dict] = {}
    frames: dict[str, dict[str, str]] = {}
    roots: dict[str, set[str]] = {}
    provenance = []
    for vi, version in enumerate(versions):
        t0 = time.time()
        files, prov = read_files(spec, version, cache, mirrors, name)
        functions: list[Function] = []
        classes: dict[str, list[str]] = {}
        count = 0
        for path, text in files:
            if path.endswith(".py"):
                tpls, fns, cls = mine_module(text, path)
                functions += fns
                for k, v in cls.items():
                    classes.setdefault(k, v)
            else:
                tpls = mine_native(text, path)
            for t in tpls:
                built = build(t.pieces)
                if built is None:
                    continue
                pattern, literal = built
                text_ = template_text(t.pieces)
                tid = template_id(engine, f"{t.level}|{t.exc}|{text_}")
                rec = templates.get(tid)
                if rec is None:
                    rec = templates[tid] = {
                        "id": tid,
                        "text": text_,
                        "pattern": pattern,
                        "literal": literal,
                        "level": t.level,
                        "exc": t.exc,
                        "seen": [],
                    }
                rec.update(module=t.module, function=t.function)
                if vi not in rec["seen"]:
                    rec["seen"].append(vi)
                    count += 1
        if spec.get("roots"):
            found, root_keys = phases(functions, classes, spec["roots"])
            for key, phase in found.items():
                frames.setdefault(key, {})[version] = phase
            for ph, keys in root_keys.items():
                roots.setdefault(ph, set()).update(keys)
            prov["functions"] = len(functions)
            prov["frame_keys"] = len({frame_key(f.module, f.qualname) for f in functions})
        prov["templates"] = count
        provenance.append(prov)
        print(
            f"mine: {name} {version}: {count} templates, {len(functions)} functions ({time.time() - t0:.1f} s)",
            file=sys.stderr,
        )
    frame_out: dict[str, str] = {}
    for key, by_version in frames.items():
        phs = set(by_version.values())
        if len(phs) == 1 and "" not in phs:  # one phase in every version that reaches it
            frame_out[key] = phs.pop()
    # a root is a frame the phase's tree starts from (named in sources.yaml); a key that is a
    # root of two phases (two functions of one name) is no root
    root_out = {ph: sorted(k for k in keys if frame_out.get(k) == ph) for ph, keys in sorted(roots.items())}
    return {
        "engine": engine,
        "source": name,
        "versions": versions,
        "provenance": provenance,
        "templates": sorted(templates.values(), key=lambda r: r["id"]),
        "frames": frame_out,
        "roots": root_out,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.mine", description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", help="names in sources.yaml (default: all)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "diagnose-mine")
    ap.add_argument("--git", action="append", default=[], metavar="ENGINE=MIRROR")
    ap.add_argument("--out", type=Path, default=ROOT / "rules" / "mined")
    ap.add_argument(
        "--skip-newest", action="store_true", help="leave out each source's newest version (held-out test)"
    )
    ap.add_argument("--config", type=Path, default=HERE / "sources.yaml")
    args = ap.parse_args(argv)
    config = yaml.safe_load(args.config.read_text())
    mirrors = dict(g.split("=", 1) for g in args.git)
    names = args.sources or list(config)
    t0 = time.time()
    for name in names:
        spec = config[name]
        versions = [str(v) for v in spec["versions"]]
        if args.skip_newest:
            versions = versions[:-1]
        data = mine_source(name, spec, args.cache / name, mirrors, versions)
        write_store(args.out / f"{name}.json", data, sys.argv)
    print(f"mine: {len(names)} sources in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
