"""How a state digest stands for a local function (a callback the timeline holds):
by its code, constants included, what it closes over and its defaults; two functions
alike in all of these are the same, and any difference tells them apart."""

from __future__ import annotations

import io
import types
from collections.abc import Callable

from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.simulation.pause_state import _StatePickler


def _pickled(obj: object) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, Observer()).dump(obj)
    return buf.getvalue()


def _closing_over(value: int) -> Callable[[], int]:
    def callback() -> int:
        return value

    return callback


def _with_default(value: int = 1) -> Callable[..., int]:
    def callback(x: int = value) -> int:
        return x + 1

    return callback


def test_the_same_callback_twice_is_the_same() -> None:
    assert _pickled(_closing_over(3)) == _pickled(_closing_over(3))
    assert _pickled(_with_default(3)) == _pickled(_with_default(3))


def test_what_a_callback_closes_over_tells_it_apart() -> None:
    assert _pickled(_closing_over(3)) != _pickled(_closing_over(4))


def test_its_defaults_tell_it_apart() -> None:
    assert _pickled(_with_default(3)) != _pickled(_with_default(4))


def test_its_constants_tell_it_apart() -> None:
    one = _with_default(3)
    code = one.__code__
    consts = tuple(2 if c == 1 else c for c in code.co_consts)
    assert consts != code.co_consts
    other = types.FunctionType(code.replace(co_consts=consts), one.__globals__, one.__name__)
    other.__qualname__ = one.__qualname__
    other.__defaults__ = one.__defaults__
    assert _pickled(one) != _pickled(other)
