"""@record against the @dataclass(slots=True) it stands in for."""

from __future__ import annotations

import dataclasses
import pickle
from typing import ClassVar

import pytest

from diagnose import model
from diagnose.records import field, record


def _pair():
    @record
    class R:
        """doc kept"""

        a: int
        b: str = "x"
        c: list[int] = field(default_factory=list)
        d: float | None = None

        def total(self) -> int:
            return self.a + len(self.c)

    @dataclasses.dataclass(slots=True)
    class D:
        a: int
        b: str = "x"
        c: list[int] = dataclasses.field(default_factory=list)
        d: float | None = None

    return R, D


def test_record_behaves_like_a_slotted_dataclass():
    R, D = _pair()
    r, d = R(1), D(1)
    assert (r.a, r.b, r.c, r.d) == (d.a, d.b, d.c, d.d)
    assert repr(R(2, "y", [3], 1.5)).split("(", 1)[1] == repr(D(2, "y", [3], 1.5)).split("(", 1)[1]
    assert R(1, c=[2]) == R(1, "x", [2]) and R(1) != R(2) and R(1) != D(1)
    assert R(1).c is not R(1).c  # a fresh default per instance
    assert R.__doc__ == "doc kept" and R(2, c=[1, 1]).total() == 4
    with pytest.raises(AttributeError):
        r.other = 1  # slots: no stray attributes
    with pytest.raises(TypeError):
        R()  # a field without a default is required
    with pytest.raises(TypeError):
        R(1, e=2)
    with pytest.raises(TypeError):
        hash(r)  # mutable data with value equality: unhashable, as dataclasses make it
    r.b = "z"
    assert r.b == "z"


def test_record_rejects_what_it_does_not_model():
    with pytest.raises(TypeError, match="without a default follows"):

        @record
        class Bad:
            a: int = 1
            b: int

    with pytest.raises(TypeError, match="ClassVar"):

        @record
        class WithClassVar:
            a: int
            limit: ClassVar[int] = 3

    class Base:
        pass

    with pytest.raises(TypeError, match="does not inherit"):

        @record
        class Child(Base):
            a: int


def test_the_models_records_round_trip_through_pickle():
    line = model.Line("log", 3, "text", message="text")
    assert pickle.loads(pickle.dumps(line)) == line
    assert not hasattr(line, "__dict__")
