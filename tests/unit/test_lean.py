"""lsf/lean.py: the run-time NamedTuple stand-in builds what typing.NamedTuple builds."""

from __future__ import annotations

import typing

import pytest

from xce_resize_plugin.lsf.lean import NamedTuple


class Lean(NamedTuple):
    """A record."""

    name: str
    count: int = 1
    tags: tuple[str, ...] = ()


class Typed(typing.NamedTuple):
    """A record."""

    name: str
    count: int = 1
    tags: tuple[str, ...] = ()


def test_same_fields_defaults_doc_and_behaviour() -> None:
    assert Lean._fields == Typed._fields
    assert Lean._field_defaults == Typed._field_defaults
    assert Lean.__doc__ == Typed.__doc__ == "A record."
    assert Lean.__module__ == __name__
    a = Lean("x", tags=("t",))
    assert tuple(a) == tuple(Typed("x", tags=("t",))) == ("x", 1, ("t",))
    assert a._replace(count=3) == Lean("x", 3, ("t",))
    assert repr(a) == "Lean(name='x', count=1, tags=('t',))"
    assert hash(a) == hash(("x", 1, ("t",)))
    with pytest.raises(AttributeError):
        a.name = "y"  # type: ignore[misc]


def test_a_field_without_default_after_one_with_default_is_refused() -> None:
    with pytest.raises(TypeError, match="Bad: a field without a default follows"):

        class Bad(NamedTuple):
            first: int = 0
            second: int
