"""What the fast-starting command paths use instead of :mod:`typing`.

``bresize`` must start within 1.6x of a bare ``python3`` (docs/performance.md), and
importing :mod:`typing` alone costs a third of that budget. The modules on its path
therefore write ``TYPE_CHECKING = False`` (mypy treats the name as true) and take
:class:`NamedTuple` from here: for mypy it *is* :class:`typing.NamedTuple`; at run time
it builds the same class with :func:`collections.namedtuple` (``collections`` is about a
millisecond; :mod:`re` and :mod:`typing`, three or more each, stay off the path).
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    from collections import namedtuple

    # typing.NamedTuple's own lists: what it never copies, and what it refuses.
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})
    _PROHIBITED = frozenset(
        {"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
         "_make", "_replace", "_asdict", "_source"}
    )  # fmt: skip

    class _RecordMeta(type):
        """Turns ``class C(NamedTuple): field: type = default`` into a namedtuple."""

        def __new__(mcls, name, bases, namespace):
            if not bases:  # the NamedTuple base itself
                return super().__new__(mcls, name, bases, namespace)
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[f] for f in fields if f in namespace]
            if any(f in namespace for f in fields[: len(fields) - len(defaults)]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            record = namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
            record.__doc__ = namespace.get("__doc__", record.__doc__)
            record.__annotations__ = namespace.get("__annotations__", {})
            # The rest of the class body (methods, properties, constants), as
            # typing.NamedTuple keeps it: mypy sees them, so run time must have them.
            for key, value in namespace.items():
                if key not in fields and key not in _SPECIAL:
                    if key in _PROHIBITED:
                        raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
                    setattr(record, key, value)
            return record

    class NamedTuple(metaclass=_RecordMeta):
        """Base class: subclasses become :func:`collections.namedtuple` classes."""


__all__ = ["NamedTuple"]
