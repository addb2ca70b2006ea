"""`@record`: plain data classes (slots, __init__, value equality, repr) without `dataclasses`.

Importing `dataclasses` pulls in `inspect` (~7 ms) and each @dataclass compiles three
generated methods (~0.4 ms a class): together a sixth of a scan's cold start, for the
twenty classes every scan defines. A record compiles one small __init__ and shares a
generic __eq__ and __repr__. It covers what those classes use — annotated fields with
defaults or `field(default_factory=...)`, no inheritance, no __post_init__ — and the
suite checks it against `dataclasses` (tests/test_records.py).
"""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_MISSING: Any = object()


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]):
        self.make = make


def field(*, default_factory: Callable[[], Any]) -> Any:
    """A default built afresh for each instance (a list, a dict…)."""
    return _Factory(default_factory)


def _eq(self: Any, other: Any) -> Any:
    # as dataclasses do: same class, then the fields compared as tuples
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__slots__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _repr(self: Any) -> str:
    return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


def record(cls: type[T]) -> type[T]:
    """Turn a class of annotated fields into a slotted data class (see the module doc)."""
    if cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__}: a record does not inherit")
    names = list(cls.__annotations__)  # its own: a record has no bases (checked above)
    if any("ClassVar" in str(cls.__annotations__[n]) for n in names):
        raise TypeError(f"{cls.__name__}: a record has no ClassVar fields (use a plain constant)")
    params: list[str] = []
    lines: list[str] = []
    env: dict[str, Any] = {"_MISSING": _MISSING}
    for n in names:
        default = cls.__dict__.get(n, _MISSING)
        if default is _MISSING:
            if any(p.endswith("=_MISSING") or "=_d_" in p for p in params):
                raise TypeError(f"{cls.__name__}: field {n} without a default follows one with a default")
            params.append(n)
            lines.append(f"    self.{n} = {n}")
        elif isinstance(default, _Factory):
            env[f"_f_{n}"] = default.make
            params.append(f"{n}=_MISSING")
            lines.append(f"    self.{n} = _f_{n}() if {n} is _MISSING else {n}")
        else:
            env[f"_d_{n}"] = default
            params.append(f"{n}=_d_{n}")
            lines.append(f"    self.{n} = {n}")
    src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(lines) or "    pass") + "\n"
    exec(src, env)  # one small function per class: the only generated code
    body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    body.update(__slots__=tuple(names), __init__=env["__init__"], __eq__=_eq, __repr__=_repr, __hash__=None)
    body["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new  # type: ignore[return-value]
