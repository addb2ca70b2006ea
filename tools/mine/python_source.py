"""Message templates and call edges from an engine's Python source, by `ast`.

A template is what a printing statement can put in a log: the format string of a
`raise X(...)`, `logger.error/warning/critical/exception(...)`, `assert …, "…"` or
`warnings.warn(...)`, with each placeholder typed (int, float or text) and named after the
expression that fills it. Call edges (caller → called names) feed `callgraph.py`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .pattern import template_text

# a logger call: <anything>.error(...), logger.warning_once(...), init_logger(...).info — the
# receiver's name must say it is a logger, so list.remove or dict.get never count
_LOG_LEVELS = {
    "critical": "critical",
    "fatal": "critical",
    "error": "error",
    "exception": "error",
    "warning": "warning",
    "warn": "warning",
    "warning_once": "warning",
    "warning_one_rank": "warning",
    "info_once": "info",
    "error_once": "error",
}
_LOGGER_NAME = re.compile(r"(?i)log(?:ger)?|^_?LOG$|^lg$")
_PCT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[hlL]?([diouxXeEfFgGcrsa%])")
_BRACE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


@dataclass
class Piece:
    """One part of a template: literal text, or a placeholder (kind: int, float, text)."""

    text: str = ""
    kind: str | None = None  # None for a literal
    name: str = ""


@dataclass
class Template:
    pieces: list[Piece]
    level: str  # raise, assert, critical, error, warning, info
    exc: str  # the exception type for raise/assert ("" for log calls)
    module: str  # path inside the package, e.g. vllm/config.py
    function: str  # qualified name inside the module
    line: int

    @property
    def text(self) -> str:
        return template_text(self.pieces)


@dataclass
class Function:
    module: str
    qualname: str
    calls: set[str] = field(default_factory=set)  # names called (functions, methods, classes)
    bases: list[str] = field(default_factory=list)  # of the class it belongs to
    # asyncio tasks this function starts (the coroutine functions' names) and the done-callbacks
    # it registers: a callback runs when the task it watches ends, in that task's phase
    tasks: set[str] = field(default_factory=set)
    done_callbacks: set[str] = field(default_factory=set)


def _expr_name(node: ast.AST) -> str:
    """The name a placeholder gets: the last identifier of the expression that fills it."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call):
            node = node.func
            continue
        if isinstance(node, ast.Subscript):
            node = node.value
            continue
        return ""


def _kind_of_spec(spec: str) -> str:
    spec = spec.rstrip()
    if spec.endswith(("d", "n", ",", "_")) or spec.endswith("x"):
        return "int"
    if spec[-1:] in ("f", "e", "g", "%", "F", "E", "G"):
        return "float"
    return "text"


def _lit(text: str) -> list[Piece]:
    return [Piece(text=text)] if text else []


def _hole(kind: str = "text", name: str = "") -> list[Piece]:
    return [Piece(kind=kind, name=name)]


class _Strings:
    """Resolves an expression to template pieces, following local string variables."""

    def __init__(self, assigns: dict[str, list[ast.AST]]):
        self.assigns = assigns

    def pieces(self, node: ast.AST | None, depth: int = 0) -> list[list[Piece]]:
        """All the templates an expression can be (a variable assigned twice gives two)."""
        if node is None or depth > 4:
            return []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [_lit(node.value)]
        if isinstance(node, ast.JoinedStr):
            out: list[Piece] = []
            for v in node.values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    out += _lit(v.value)
                elif isinstance(v, ast.FormattedValue):
                    spec = ""
                    if isinstance(v.format_spec, ast.JoinedStr):
                        spec = "".join(c.value for c in v.format_spec.values if isinstance(c, ast.Constant))
                    out += _hole(_kind_of_spec(spec) if spec else "text", _expr_name(v.value))
            return [out]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            lefts = self.pieces(node.left, depth + 1) or [_hole()]
            rights = self.pieces(node.right, depth + 1) or [_hole()]
            return [a + b for a in lefts[:3] for b in rights[:3]]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            return [percent(p, args) for p in self.pieces(node.left, depth + 1)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            return [
                braces(p, node.args, {k.arg: k.value for k in node.keywords if k.arg})
                for p in self.pieces(node.func.value, depth + 1)
            ]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
            return []  # "\n".join(parts): built at run time
        if isinstance(node, ast.Name) and node.id in self.assigns:
            out2: list[list[Piece]] = []
            for value in self.assigns[node.id][:4]:
                out2 += self.pieces(value, depth + 1)
            return out2
        return []


def _expand(
    pieces: list[Piece], rx: re.Pattern[str], hole: Callable[[re.Match[str]], list[Piece]]
) -> list[Piece]:
    """Each literal piece cut at the format's conversions, each conversion replaced by what
    `hole` makes of it; placeholders already there stay."""
    out: list[Piece] = []
    for p in pieces:
        if p.kind is not None:
            out.append(p)
            continue
        pos = 0
        for m in rx.finditer(p.text):
            out += _lit(p.text[pos : m.start()])
            out += hole(m)
            pos = m.end()
        out += _lit(p.text[pos:])
    return out


def percent(pieces: list[Piece], args: list[ast.AST]) -> list[Piece]:
    """A %-format string's pieces: each conversion a typed placeholder, named after its arg."""
    filled = iter(args)

    def hole(m: re.Match[str]) -> list[Piece]:
        conv = m.group(1)
        if conv == "%":
            return _lit("%")
        kind = "int" if conv in "diouxX" else "float" if conv in "eEfFgG" else "text"
        arg = next(filled, None)
        return _hole(kind, _expr_name(arg) if arg is not None else "")

    return _expand(pieces, _PCT, hole)


def braces(pieces: list[Piece], args: list[ast.AST], kwargs: dict[str, ast.AST]) -> list[Piece]:
    """A str.format string's pieces: {}, {0}, {name}, {x:.2f}."""
    auto = iter(args)

    def hole(m: re.Match[str]) -> list[Piece]:
        if m.group(1) is None:  # {{ or }}
            return _lit(m.group(0)[0])
        field_, _, spec = m.group(1).partition(":")
        field_ = field_.split("!")[0]
        if field_ == "":
            src = next(auto, None)
        elif field_.isdigit():
            src = args[int(field_)] if int(field_) < len(args) else None
        else:
            src = kwargs.get(field_.split(".")[0].split("[")[0])
        name = _expr_name(src) if src is not None else field_
        return _hole(_kind_of_spec(spec) if spec else "text", name)

    return _expand(pieces, _BRACE, hole)


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if p.kind is None and out and out[-1].kind is None:
            out[-1] = Piece(text=out[-1].text + p.text)
        elif p.kind is None and not p.text:
            continue
        else:
            out.append(p)
    return out


def _exc_name(node: ast.AST | None) -> tuple[str, ast.AST | None]:
    """(exception type, its message argument) of `raise X(msg)`."""
    if isinstance(node, ast.Call):
        name = _expr_name(node.func)
        arg = (
            node.args[0]
            if node.args
            else next((k.value for k in node.keywords if k.arg in ("msg", "message", "detail")), None)
        )
        return name, arg
    return "", None


def _is_logger(func: ast.AST) -> str | None:
    if not isinstance(func, ast.Attribute) or func.attr not in _LOG_LEVELS:
        return None
    recv = func.value
    name = _expr_name(recv)
    if isinstance(recv, ast.Call):  # logging.getLogger(__name__).error(...)
        name = "logger" if _expr_name(recv.func) in ("getLogger", "init_logger") else ""
    if name == "logging" or _LOGGER_NAME.search(name or ""):
        return _LOG_LEVELS[func.attr]
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.templates: list[Template] = []
        self.functions: list[Function] = []
        self.classes: dict[str, list[str]] = {}
        self._scope: list[str] = []
        self._func: list[Function] = []
        self._strings: list[_Strings] = [_Strings({})]
        self._bases: list[list[str]] = []

    # scopes -------------------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [_expr_name(b) for b in node.bases]
        self.classes.setdefault(node.name, bases)
        self._scope.append(node.name)
        self._bases.append(bases)
        self.generic_visit(node)
        self._bases.pop()
        self._scope.pop()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._scope.append(node.name)
        fn = Function(self.module, ".".join(self._scope), bases=self._bases[-1] if self._bases else [])
        self.functions.append(fn)
        self._func.append(fn)
        assigns: dict[str, list[ast.AST]] = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                assigns.setdefault(sub.targets[0].id, []).append(sub.value)
            elif (
                isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name) and sub.value is not None
            ):
                assigns.setdefault(sub.target.id, []).append(sub.value)
        self._strings.append(_Strings(assigns))
        self.generic_visit(node)
        self._strings.pop()
        self._func.pop()
        self._scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    # statements ---------------------------------------------------------------------
    def _emit(
        self, node: ast.AST | None, level: str, exc: str, line: int, args: list[ast.AST] | None = None
    ) -> None:
        for pieces in self._strings[-1].pieces(node):
            if args:  # logger.warning("… %s", x): the format is filled by the call's own args
                pieces = percent(pieces, args)
            pieces = _merge(pieces)
            if any(p.kind is None and p.text.strip() for p in pieces):
                fn = ".".join(self._scope) or "<module>"
                self.templates.append(Template(pieces, level, exc, self.module, fn, line))

    def visit_Raise(self, node: ast.Raise) -> None:
        exc, arg = _exc_name(node.exc)
        if exc:
            self._emit(arg, "raise", exc, node.lineno)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self._emit(node.msg, "assert", "AssertionError", node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        level = _is_logger(node.func)
        if level and node.args:
            self._emit(node.args[0], level, "", node.lineno, node.args[1:])
        elif (
            _expr_name(node.func) == "warn"
            and node.args
            and _expr_name(getattr(node.func, "value", node.func)) == "warnings"
        ):
            self._emit(node.args[0], "warning", "", node.lineno)
        if self._func:
            fn = self._func[-1]
            name = _expr_name(node.func)
            _note_task_or_callback(fn, name, node)
            if name == "__init__" or (
                isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call)
                and _expr_name(node.func.value.func) == "super"
            ):
                fn.calls.update(f"{b}.__init__" for b in fn.bases if b)
                if node.func.attr != "__init__" if isinstance(node.func, ast.Attribute) else False:
                    fn.calls.add(node.func.attr)  # super().method(): the bases' method
            elif name:
                # self.foo() / foo(): the caller's own class or module first (callgraph.py)
                recv = node.func.value if isinstance(node.func, ast.Attribute) else None
                if isinstance(recv, ast.Name) and recv.id in ("self", "cls"):
                    fn.calls.add("self:" + name)
                elif isinstance(node.func, ast.Name):
                    fn.calls.add("local:" + name)
                else:
                    fn.calls.add(name)
        self.generic_visit(node)


_TASK_STARTERS = ("create_task", "ensure_future", "run_coroutine_threadsafe")


def _note_task_or_callback(fn: Function, name: str, node: ast.Call) -> None:
    """`loop.create_task(self.run_engine_loop())` starts a task of run_engine_loop;
    `task.add_done_callback(partial(on_finish, …))` registers on_finish for it."""
    if not node.args:
        return
    arg = node.args[0]
    if name in _TASK_STARTERS and isinstance(arg, ast.Call):
        fn.tasks.add(_expr_name(arg.func))
    elif name == "add_done_callback":
        if isinstance(arg, ast.Call) and _expr_name(arg.func) == "partial" and arg.args:
            arg = arg.args[0]
        if isinstance(arg, ast.Name | ast.Attribute):
            fn.done_callbacks.add(_expr_name(arg))


def mine_module(source: str, module: str) -> tuple[list[Template], list[Function], dict[str, list[str]]]:
    """Templates, functions (with the names they call) and classes (with bases) of one file."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return [], [], {}
    v = _Visitor(module)
    v.visit(tree)
    return v.templates, v.functions, v.classes
