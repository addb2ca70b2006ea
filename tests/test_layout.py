"""The package's layout: its folders are its parts, stacked, and every import runs down the stack.

Read from the code itself (every `import`, at the top of a module or inside a function), so a
new import that runs up between parts, a cycle, or a module grown past its size fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "diagnose"

# Bottom to top: a part may import the parts below it, never one above (ARCHITECTURE.md).
PARTS = (
    "base",
    "model",
    "search",
    "read",
    "knowledge",
    "host",
    "budget",
    "match",
    "findings",
    "advice",
    "pipeline",
    "outputs",
    "store",
    "plan",
    "stream",
    "live",
    "fleet",
    "probe",
    "cli",
)
TOP_LEVEL = {"__init__.py", "__main__.py", "entry.py", "rules"}  # rules/: the data, in a wheel
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "rules":
            continue
        dotted = ".".join(("diagnose", *rel.with_suffix("").parts))
        out[dotted.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module of the package this one imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] == "diagnose":
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "diagnose")
    return found & (set(_modules()) | {"diagnose"})


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else None


MODULES = _modules()
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_top_of_the_package_holds_only_the_parts_and_the_entry():
    here = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert here - TOP_LEVEL == set(PARTS)


@pytest.mark.parametrize("part", PARTS)
def test_each_part_says_what_enters_and_what_leaves(part):
    init = PACKAGE / part / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert "In:" in doc and "Out:" in doc, f"{part}/__init__.py: say what enters (In:) and leaves (Out:)"


def test_imports_run_down_between_parts():
    rank = {p: i for i, p in enumerate(PARTS)}
    upward = []
    for name, targets in IMPORTS.items():
        mine = _part(name)
        for target in targets:
            theirs = _part(target)
            if mine and theirs and rank[theirs] > rank[mine]:
                upward.append(f"{name} -> {target}")
            if mine and target == "diagnose":
                continue  # the package's own __version__: defined there, imports nothing
            if mine and theirs is None and target != "diagnose":
                upward.append(f"{name} -> {target} (the entry is above every part)")
    assert not upward, "imports that run up the stack:\n" + "\n".join(sorted(upward))


def test_no_module_imports_itself_back():
    """No cycle among modules (a part's own modules included)."""
    graph = {n: {t for t in ts if t in MODULES and t != n} for n, ts in IMPORTS.items()}
    seen: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(n: str, path: list[str]) -> None:
        seen[n] = 1
        for t in sorted(graph[n]):
            if seen.get(t) == 1:
                cycles.append(" -> ".join([*path[path.index(t) :], t]))
            elif t not in seen:
                visit(t, [*path, t])
        seen[n] = 2

    for n in sorted(graph):
        if n not in seen:
            visit(n, [n])
    # a package __init__ that hands names on (stream) imports its own module: not a cycle
    cycles = [c for c in cycles if not all(x.startswith("diagnose.stream") for x in c.split(" -> "))]
    assert not cycles, "\n".join(cycles)


def test_modules_functions_and_classes_stay_readable():
    too_long = []
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > MAX_FUNCTION_LINES:
                too_long.append(f"{name}.{node.name}: a function of {size} lines")
            if isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
                too_long.append(f"{name}.{node.name}: a class of {size} lines")
    assert not too_long, "\n".join(too_long)


def test_the_library_api_is_where_the_readme_shows_it():
    from diagnose.stream import Event, Sessions, StreamSession

    assert Sessions.__module__ == StreamSession.__module__ == Event.__module__ == "diagnose.stream.session"
