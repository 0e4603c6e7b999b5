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


def test_methods_and_properties_are_kept_as_typing_keeps_them() -> None:
    """mypy sees them (lean.py *is* typing's NamedTuple to it), so a record that uses
    one must not fail at run time."""

    class Sized(NamedTuple):
        size: int

        def doubled(self) -> int:
            return self.size * 2

        @property
        def big(self) -> bool:
            return self.size > 3

    record = Sized(4)
    assert (record.doubled(), record.big) == (8, True)
    assert Sized._fields == ("size",)
    assert Sized.__qualname__.endswith("<locals>.Sized")


def test_overwriting_a_namedtuple_attribute_is_refused_as_typing_refuses_it() -> None:
    with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):

        class Bad(NamedTuple):
            first: int

            def _replace(self, **changes: int) -> Bad:  # type: ignore[misc]
                return self
