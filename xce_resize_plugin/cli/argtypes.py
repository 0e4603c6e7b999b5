"""Numbers on the command line, read as the rest of the package reads them.

argparse's ``type=int`` and ``type=float`` take more than a user means: digits of other
scripts (a full-width three, U+FF13), underscores (``1_0``), blanks around the value,
``nan`` and ``inf``. These types take plain ASCII decimals only
(:mod:`xce_resize_plugin.core.decimal_text`), so such a value is a usage error (exit 2)
naming the option, as it is in a file or a request.
"""

from __future__ import annotations

import argparse

from xce_resize_plugin.core.decimal_text import read_decimal, read_number

__all__ = ["count", "integer", "number"]


def count(text: str) -> int:
    """A whole number of ASCII digits (at most 19)."""
    value = read_decimal(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a whole number of decimal digits: {text!r}")
    return value


def integer(text: str) -> int:
    """A whole number, with an optional sign (a seed may be negative)."""
    sign, digits = (text[0], text[1:]) if text[:1] in ("-", "+") else ("", text)
    value = read_decimal(digits)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a whole number of decimal digits: {text!r}")
    return -value if sign == "-" else value


def number(text: str) -> float:
    """A finite decimal number (sign, fraction and exponent allowed; ASCII only)."""
    value = read_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a finite decimal number: {text!r}")
    return value
