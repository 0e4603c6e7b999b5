"""A cattrs converter for JSON from outside the process: values are taken as they are
written, never coerced.

cattrs on its own would read ``"3"`` as 3, 2.5 as 2 and 1 as true. The REST API's input
(core/converters.py) and the answers the command lines read (cli/answers.py) must say
what they mean, so both structure through :func:`strict_converter`, and both report a
value of the wrong shape as one line per problem with :func:`describe`.
"""

from __future__ import annotations

import math
from typing import Any

import cattrs
from cattrs.preconf.json import make_converter

__all__ = ["describe", "strict", "strict_converter", "strict_ids", "strict_number"]


def strict(kind: type) -> Any:
    """A structure hook taking exactly ``kind`` (``bool`` is no ``int``)."""

    def check(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    return check


def strict_number(value: Any, _: Any) -> float:
    """A JSON number (not a string, not true/false), finite, as a float."""
    if type(value) not in (int, float) or not math.isfinite(value):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def strict_ids(value: Any, _: Any) -> tuple[int, ...]:
    """A JSON array of integers: cattrs would take any iterable, so "" (or {}) would
    be no ids at all."""
    if type(value) is not list:
        raise TypeError(f"expected a list of task ids, got {type(value).__name__} {value!r}")
    check = strict(int)
    return tuple(check(v, int) for v in value)


def strict_converter(forbid_extra_keys: bool) -> cattrs.Converter:
    """A JSON converter whose ``int``, ``str``, ``bool``, ``float`` and
    ``tuple[int, ...]`` take only values of that JSON type."""
    conv = make_converter(forbid_extra_keys=forbid_extra_keys)
    for kind in (int, str, bool):
        conv.register_structure_hook(kind, strict(kind))
    conv.register_structure_hook(float, strict_number)
    conv.register_structure_hook_func(lambda t: t == tuple[int, ...], strict_ids)
    return conv


def _format(exc: BaseException, type_: Any) -> str:
    # The strict hooks say what was wrong with the value; keep their words.
    if isinstance(exc, TypeError) and str(exc).startswith("expected "):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def describe(exc: Exception) -> str:
    """What was wrong, one ``… @ $.path`` item per problem, joined by ``; ``."""
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, path="$", format_exception=_format))
    return f"{type(exc).__name__}: {exc}"
