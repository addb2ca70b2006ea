"""Frame phases: which phase's call tree each function of an engine belongs to.

The call graph is resolved by name (a call to `x.create_weights(...)` may reach every
`create_weights` the package defines; `Foo(...)` reaches `Foo.__init__`): an
over-approximation, kept in check by three limits — a search stops at another phase's
roots, names defined in very many places (`forward`, `get`) are not followed, and a
function reached from two phases' roots has no phase. A done-callback registered on an
asyncio task is reached from the task's coroutine (it runs when that task ends: the engine
loop's callback is the loop's phase). What remains is a map from the
frame a traceback prints (file stem, function) to the one phase it can run in.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict, deque
from collections.abc import Iterable

from .python_source import Function

PHASES = ("load", "startup", "runtime")
MAX_DEFS = 12  # a name defined in more places than this is too common to follow
MAX_DEPTH = 14


def frame_key(module: str, qualname: str) -> str:
    """What a traceback shows of a function: its file's stem and its own name."""
    stem = module.rsplit("/", 1)[-1].removesuffix(".py")
    return f"{stem}:{qualname.rsplit('.', 1)[-1]}"


def _matches(root: str, fn: Function) -> bool:
    """A root is `name` (any function so named), `Class.name`, or `path-glob:qualname-glob`."""
    if ":" in root:
        path, _, qual = root.partition(":")
        return fnmatch.fnmatch(fn.module, path) and fnmatch.fnmatch(fn.qualname, qual)
    if "." in root:
        return fn.qualname == root or fn.qualname.endswith("." + root)
    return fn.qualname.rsplit(".", 1)[-1] == root


def phases(
    functions: Iterable[Function], classes: dict[str, list[str]], roots: dict[str, list[str]]
) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(frame key → the one phase whose roots reach it, or "" when two phases' roots do;
    phase → the frame keys of its roots)."""
    fns = list(functions)
    by_name: dict[str, list[int]] = defaultdict(list)
    for i, fn in enumerate(fns):
        parts = fn.qualname.split(".")
        by_name[parts[-1]].append(i)
        if len(parts) >= 2:
            by_name[".".join(parts[-2:])].append(i)  # Class.__init__ for instantiations
    # a done-callback runs when the task it watches ends: the task's coroutine "calls" it
    for fn in fns:
        for task in fn.tasks if fn.done_callbacks else ():
            for j in by_name.get(task, []):
                fns[j].calls.update(fn.done_callbacks)
    root_ids = {
        ph: {i for i, fn in enumerate(fns) if any(_matches(r, fn) for r in roots.get(ph, ()))}
        for ph in PHASES
    }
    any_root = {i: ph for ph, ids in root_ids.items() for i in ids}

    def callees(i: int) -> Iterable[int]:
        caller = fns[i]
        own_class = caller.qualname.rsplit(".", 1)[0] if "." in caller.qualname else ""
        for call in caller.calls:
            how, _, name = call.rpartition(":")
            targets: list[int] = []
            if name in classes and how != "self":  # Foo(...) builds a Foo: its (inherited) __init__ runs
                cls, seen = name, 0
                while cls and seen < 6:
                    targets = by_name.get(f"{cls}.__init__", [])
                    if targets:
                        break
                    cls = next(iter(classes.get(cls, [])), "")
                    seen += 1
                yield from targets
                continue
            if "." in name:
                yield from by_name.get(name, [])
                continue
            everywhere = by_name.get(name, [])
            if how == "self":  # the caller's class, then its bases, before any other class
                chain = [own_class.rsplit(".", 1)[-1], *caller.bases]
                targets = [
                    j for j in everywhere if fns[j].qualname.rsplit(".", 1)[0].rsplit(".", 1)[-1] in chain
                ]
            elif how == "local":  # a plain call: a function of the same module first
                targets = [j for j in everywhere if fns[j].module == caller.module]
            if not targets and len(everywhere) <= MAX_DEFS:
                targets = everywhere
            yield from targets

    reached: dict[int, set[str]] = defaultdict(set)
    for ph in PHASES:
        queue = deque((i, 0) for i in root_ids[ph])
        seen = set(root_ids[ph])
        while queue:
            i, depth = queue.popleft()
            reached[i].add(ph)
            if depth >= MAX_DEPTH:
                continue
            for j in callees(i):
                if j in seen or any_root.get(j, ph) != ph:
                    continue  # another phase's root starts that phase's tree
                seen.add(j)
                queue.append((j, depth + 1))
    by_key: dict[str, set[str]] = defaultdict(set)
    for i, phs in reached.items():
        by_key[frame_key(fns[i].module, fns[i].qualname)] |= phs
    # "" for a frame that two phases reach: with other versions' phases it stays ambiguous
    root_keys = {ph: {frame_key(fns[i].module, fns[i].qualname) for i in ids} for ph, ids in root_ids.items()}
    return {k: next(iter(v)) if len(v) == 1 else "" for k, v in sorted(by_key.items())}, root_keys
