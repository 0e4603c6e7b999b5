"""Counts and ids written as decimal text, read one way everywhere.

``str.isdigit()`` is not the test for "``int()`` reads this": it accepts digits that
``int()`` refuses (a superscript two), and ``int()`` accepts digits of other scripts
and refuses more than a few thousand of them. A count or an id that comes from a file,
an option or a request is read here instead: ASCII digits only, at most 19 of them (a
64-bit integer), so that what is refused is refused with the caller's message, never
with a ``ValueError`` from ``int()``.
"""

from __future__ import annotations

import math
import re

__all__ = ["is_decimal_number", "read_decimal", "read_number"]

_DECIMAL = re.compile(r"[0-9]{1,19}")
# A plain decimal number: float() also takes "nan", "inf", "1_000", " 5 " and other
# scripts' digits, none of which a user writing a number means.
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
#: Longer text is no number a user writes (and float() of it would cost for nothing).
_NUMBER_CHARS = 64


def read_decimal(text: str) -> int | None:
    """``text`` as a non-negative integer when it is 1 to 19 ASCII digits, else ``None``
    (the caller says what is wrong, in its own words)."""
    return int(text) if _DECIMAL.fullmatch(text) else None


def is_decimal_number(text: str) -> bool:
    """Whether ``text`` is a plain ASCII decimal number (optional sign, fraction and
    exponent), which ``float()`` reads; infinite when too large for a float."""
    return _NUMBER.fullmatch(text) is not None


def read_number(text: str) -> float | None:
    """``text`` as a finite float when it is a plain ASCII decimal number (optional
    sign, fraction and exponent), else ``None``: ``1e999`` too, which is no float."""
    if len(text) > _NUMBER_CHARS or not is_decimal_number(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None
